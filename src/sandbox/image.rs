//! The agent's image in a sandbox's VM (issue 24, ADR 0033).
//!
//! Nothing publishes agent images. Unless `PPP_<AGENT>_IMAGE` names one
//! (which provisioning pulls), ppp builds the agent's image from its
//! Containerfile (the embedded `assets/<agent>.Containerfile`, or the file
//! `PPP_<AGENT>_CONTAINERFILE` names) inside the VM with the VM's own
//! podman, so every fetch of the build goes through the tunnel under the
//! sandbox's policy. The tag is a hash of the Containerfile and the build
//! arguments: `localhost/ppp/<agent>:<hash>`, so a new ppp with a changed
//! Containerfile builds a new image.
//!
//! A build made while a sandbox is created (before any agent ran in it) is
//! saved on the host once, as an OCI archive under `$PPP_CACHE/images`
//! with a digest file written after it; later sandboxes load it without a
//! network fetch. An archive whose digest or size does not match (cut off,
//! corrupt, or its digest file missing) is removed and built again, never
//! loaded. A build in a VM an agent has used is never cached: that guest
//! could have tampered with its podman, and the cache feeds every later
//! sandbox.

use std::fmt::Write as _;
use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::machine::{last_line, open_log, run_logged};
use super::provision::{GUEST_CA_BUNDLE, GUEST_DIR};
use super::ui::Ui;
use super::{ImageOrigin, Record};
use crate::agent::Agent;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec;
use crate::podman::Podman;
use crate::progress;
use crate::state;

/// Where a build's RUN steps find the VM's CA bundle (mitmproxy's CA
/// included): a read-only volume of the build, never a layer.
pub const BUILD_CA: &str = "/run/ppp-build/ca.pem";
/// Variables the build's RUN steps get pointing at [`BUILD_CA`], as build
/// arguments: the Containerfile declares them with `ARG`, so they are in
/// the steps' environment but not in the image's.
pub const BUILD_CA_VARS: &[&str] =
    &["SSL_CERT_FILE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO"];
/// The hosts ppp's own Containerfiles fetch from: the base image's registry
/// (Docker Hub and its blob CDN), Debian's mirror, npm. All in `balanced`.
pub const BUILD_HOSTS: &[&str] = &[
    "registry-1.docker.io",
    "auth.docker.io",
    "production.cloudflare.docker.com",
    "deb.debian.org",
    "registry.npmjs.org",
];
/// A build may fetch a whole toolchain over a slow link.
const BUILD_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Copies of an image (save, load, copy out and in).
const COPY_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The largest archive the host keeps: the guest writes it, and the host's
/// disk is not the guest's to fill. Agent images are well under 2 GiB.
pub const MAX_ARCHIVE_BYTES: u64 = 8 << 30;
/// How much of the build's output is read at a time, and how much of its
/// end a failure looks at for the failing step.
const SHOW_CHUNK: u64 = 256 * 1024;
/// How many of the sandbox's last flows a failed build looks through for
/// refusals.
const REFUSAL_FLOWS: usize = 2000;

fn guest_build_dir() -> String {
    format!("{GUEST_DIR}/build")
}

fn guest_archive() -> String {
    format!("{GUEST_DIR}/image.oci.tar")
}

/// Which image a sandbox's agent runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// `PPP_<AGENT>_IMAGE`: provisioning pulls it.
    Given { image: String, var: String },
    /// Built from a Containerfile (or loaded from the cache).
    Build(Recipe),
}

impl Choice {
    /// The image reference the agent container runs.
    #[must_use]
    pub fn image(&self) -> String {
        match self {
            Self::Given { image, .. } => image.clone(),
            Self::Build(r) => r.tag(),
        }
    }

    /// What provision.sh pulls (`--image`): only an image the user named.
    #[must_use]
    pub fn to_pull(&self) -> Option<&str> {
        match self {
            Self::Given { image, .. } => Some(image),
            Self::Build(_) => None,
        }
    }
}

/// What an image is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub agent: &'static str,
    pub containerfile: Vec<u8>,
    /// Where the Containerfile came from, for messages: `embedded
    /// assets/opencode.Containerfile` or `/path (PPP_OPENCODE_CONTAINERFILE)`.
    pub source: String,
    /// sha256 (hex) of the Containerfile and the build arguments.
    pub hash: String,
}

impl Recipe {
    #[must_use]
    pub fn new(agent: &'static str, containerfile: Vec<u8>, source: String) -> Self {
        let mut h = Sha256::new();
        h.update(b"ppp agent image 1\n");
        for (k, v) in build_args() {
            h.update(format!("--build-arg {k}={v}\n").as_bytes());
        }
        h.update(format!("--volume {GUEST_CA_BUNDLE}:{BUILD_CA}:ro\n\n").as_bytes());
        h.update(&containerfile);
        let hash = h.finalize().iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
        Self { agent, containerfile, source, hash }
    }

    /// The hash's first 16 hex digits (64 bits): the tag and cache key.
    #[must_use]
    pub fn short(&self) -> &str {
        &self.hash[..16]
    }

    /// `localhost/ppp/<agent>:<hash>`.
    #[must_use]
    pub fn tag(&self) -> String {
        format!("localhost/ppp/{}:{}", self.agent, self.short())
    }
}

/// The build arguments every build gets: the CA variables.
fn build_args() -> Vec<(&'static str, &'static str)> {
    BUILD_CA_VARS.iter().map(|v| (*v, BUILD_CA)).collect()
}

/// The image `agent` runs: `PPP_<AGENT>_IMAGE` wins; else a build from
/// `PPP_<AGENT>_CONTAINERFILE` or the embedded Containerfile. A
/// Containerfile that cannot be read is refused here, before anything is
/// created.
pub fn choose(agent: &'static Agent, var: impl Fn(&str) -> Option<String>) -> Result<Choice> {
    if let Some(image) = agent.image_override(&var) {
        return Ok(Choice::Given { image, var: agent.image_var() });
    }
    let cf_var = agent.containerfile_var();
    if let Some(path) = var(&cf_var).filter(|v| !v.trim().is_empty()) {
        let text = std::fs::read(&path).map_err(|e| {
            fail(format!("{cf_var}=`{path}` cannot be read: {e}"))
                .hint(format!("point {cf_var} at a Containerfile, or unset it to build ppp's own"))
                .code(2)
        })?;
        if !String::from_utf8_lossy(&text).lines().any(|l| l.trim_start().to_ascii_uppercase().starts_with("FROM ")) {
            return Err(fail(format!("{cf_var}=`{path}` is not a Containerfile: it has no `FROM` line"))
                .hint(format!("point {cf_var} at a Containerfile, or unset it to build ppp's own"))
                .code(2)
                .into());
        }
        return Ok(Choice::Build(Recipe::new(agent.name, text, format!("`{path}` ({cf_var})"))));
    }
    Ok(Choice::Build(Recipe::new(
        agent.name,
        agent.embedded_containerfile(),
        format!("ppp's embedded assets/{}", agent.containerfile),
    )))
}

/// What the host's cache holds for a recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    Missing,
    /// The archive and its digest file agree (size only, or size and
    /// digest after [`verify`]).
    Valid {
        bytes: u64,
    },
    /// An archive that must not be loaded, and why.
    Corrupt(String),
}

/// `sha256:<hex> <size>`, the digest file's one line.
fn parse_sum(text: &str) -> Option<(String, u64)> {
    let (digest, size) = text.trim().split_once(' ')?;
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(())?;
    Some((hex.to_ascii_lowercase(), size.trim().parse().ok()?))
}

/// The cache's state for `r`, by sizes alone (cheap: for `ppp setup`).
pub fn cache_state(dirs: &Dirs, r: &Recipe) -> Cached {
    check_cache(dirs, r, false)
}

/// The cache's state for `r`, with the archive's digest computed: what a
/// load trusts.
pub fn verify(dirs: &Dirs, r: &Recipe) -> Cached {
    check_cache(dirs, r, true)
}

fn check_cache(dirs: &Dirs, r: &Recipe, digest: bool) -> Cached {
    let archive = dirs.image_archive(r.agent, r.short());
    let sum = dirs.image_archive_sum(r.agent, r.short());
    let Ok(meta) = std::fs::metadata(&archive) else {
        return Cached::Missing;
    };
    let Some((want, size)) = std::fs::read_to_string(&sum).ok().as_deref().and_then(parse_sum) else {
        return Cached::Corrupt(format!("`{}` is missing or unreadable", sum.display()));
    };
    if meta.len() != size {
        return Cached::Corrupt(format!(
            "`{}` has {} bytes, not the {size} it was saved with",
            archive.display(),
            meta.len()
        ));
    }
    if digest {
        match sha256_file(&archive) {
            Ok(got) if got == want => {}
            Ok(got) => {
                return Cached::Corrupt(format!("`{}` has digest sha256:{got}, not sha256:{want}", archive.display()));
            }
            Err(e) => return Cached::Corrupt(format!("`{}` cannot be read: {e:#}", archive.display())),
        }
    }
    Cached::Valid { bytes: size }
}

fn sha256_file(path: &Path) -> Result<String> {
    crate::template::sha256_file(path, &|_| {})
}

/// Remove an archive and its digest file (a corrupt one, before a build).
fn discard(dirs: &Dirs, r: &Recipe) {
    let _ = std::fs::remove_file(dirs.image_archive_sum(r.agent, r.short()));
    let _ = std::fs::remove_file(dirs.image_archive(r.agent, r.short()));
}

/// Make sure the VM has the agent's image, after provisioning (the tunnel
/// and the CA are up). `may_cache`: the VM has never run an agent, so a
/// build here may be saved for every later sandbox. Returns the image and
/// where it came from (`None` when it was in the VM already, e.g. a
/// reattach).
pub fn ensure(
    dirs: &Dirs,
    podman: &Podman,
    rec: &Record,
    choice: &Choice,
    may_cache: bool,
    ui: Ui,
) -> Result<(String, Option<ImageOrigin>)> {
    let r = match choice {
        Choice::Given { image, .. } => return Ok((image.clone(), Some(ImageOrigin::Pulled))),
        Choice::Build(r) => r,
    };
    // Every caller's podman is bound to the sandbox's own home here, so a
    // caller holding the user's podman (setup --build-images) cannot reach
    // another home's machine.
    let podman = &crate::sandbox::podman_for(podman, dirs, rec);
    let tag = r.tag();
    if in_vm(dirs, podman, rec, &tag)? {
        return Ok((tag, None));
    }
    if load_cached(dirs, podman, rec, r, ui)? {
        return Ok((tag, Some(ImageOrigin::Cached)));
    }
    build(dirs, podman, rec, r, ui)?;
    if may_cache && let Err(e) = save(dirs, podman, rec, r, ui) {
        // The sandbox has its image; only later ones lose the shortcut.
        eprintln!("warning: the {} image was not saved to the cache: {e:#}", r.agent);
    }
    Ok((tag, Some(ImageOrigin::Built)))
}

/// Whether the VM's (rootless, the ssh user's) podman has `tag`.
fn in_vm(dirs: &Dirs, podman: &Podman, rec: &Record, tag: &str) -> Result<bool> {
    let inv = podman.ssh(&rec.machine_name, &["podman", "image", "exists", tag]).timeout(Duration::from_secs(60));
    let (code, out) = exec::output(&inv)?;
    let log = open_log(dirs, &rec.name)?;
    let _ = writeln!(&log, "$ {inv}\n{}{}(exit {code})", out.stdout, out.stderr);
    match code {
        0 => Ok(true),
        1 => Ok(false),
        _ => Err(fail(format!("`podman image exists {tag}` failed in the VM: {}", last_line(&out.stderr)))
            .hint(format!("see `{}`", dirs.sandbox_machine_log(&rec.name).display()))
            .into()),
    }
}

/// Load the cached archive into the VM when there is one that checks out;
/// false (and a corrupt one removed) when there is none.
fn load_cached(dirs: &Dirs, podman: &Podman, rec: &Record, r: &Recipe, ui: Ui) -> Result<bool> {
    let _lock = state::Lock::acquire(&dirs.image_archive_lock(r.agent, r.short()))?;
    match verify(dirs, r) {
        Cached::Missing => return Ok(false),
        Cached::Corrupt(why) => {
            ui.note(&format!("the cached {} image is not usable ({why}); building it again", r.agent));
            discard(dirs, r);
            return Ok(false);
        }
        Cached::Valid { .. } => {}
    }
    let archive = dirs.image_archive(r.agent, r.short());
    let machine = &rec.machine_name;
    ui.timed(&format!("loading the cached {} image {}", r.agent, r.tag()), || {
        run_logged(
            dirs,
            &rec.name,
            &podman.copy_in(&archive, machine, &guest_archive()).timeout(COPY_TIMEOUT),
            "copying the cached image into the VM",
        )?;
        let loaded = run_logged(
            dirs,
            &rec.name,
            &podman.ssh(machine, &["podman", "load", "--input", &guest_archive()]).timeout(COPY_TIMEOUT),
            "loading the cached image",
        );
        let _ = exec::run(&podman.ssh(machine, &["rm", "-f", &guest_archive()]));
        loaded
    })?;
    if in_vm(dirs, podman, rec, &r.tag())? {
        return Ok(true);
    }
    ui.note(&format!("the cached {} image did not hold {}; building it again", r.agent, r.tag()));
    discard(dirs, r);
    Ok(false)
}

/// The `podman build` line run in the VM.
fn build_argv(r: &Recipe) -> Vec<String> {
    let dir = guest_build_dir();
    let mut line: Vec<String> = ["podman", "build", "--tag"].iter().map(|s| (*s).to_owned()).collect();
    line.push(r.tag());
    line.extend(["--file".into(), format!("{dir}/Containerfile")]);
    // The CA for the RUN steps, read-only and outside the image's layers.
    line.extend(["--volume".into(), format!("{GUEST_CA_BUNDLE}:{BUILD_CA}:ro")]);
    for (k, v) in build_args() {
        line.extend(["--build-arg".into(), format!("{k}={v}")]);
    }
    line.push(dir);
    line
}

/// Build `r` in the VM, showing each STEP as it starts.
fn build(dirs: &Dirs, podman: &Podman, rec: &Record, r: &Recipe, ui: Ui) -> Result<()> {
    let machine = &rec.machine_name;
    let staged = dirs.sandbox(&rec.name).join("Containerfile");
    state::write_atomic(&staged, &r.containerfile)?;
    let dir = guest_build_dir();
    // A fresh context each time: only the Containerfile is in it.
    run_logged(
        dirs,
        &rec.name,
        &podman.ssh(machine, &["sh", "-c", &format!("rm -rf {dir} && mkdir -p -m 0700 {dir}")]),
        "preparing the image build",
    )?;
    run_logged(
        dirs,
        &rec.name,
        &podman.copy_in(&staged, machine, &format!("{dir}/Containerfile")),
        "copying the Containerfile",
    )?;
    let _ = std::fs::remove_file(&staged);
    let inv = podman.ssh(machine, &build_argv(r)).timeout(BUILD_TIMEOUT);
    let log_path = dirs.sandbox_machine_log(&rec.name);
    let log = open_log(dirs, &rec.name)?;
    let _ = writeln!(&log, "# building {} from {}\n$ {inv}", r.tag(), r.source);
    let from = std::fs::metadata(&log_path).map_or(0, |m| m.len());
    let started_at = OffsetDateTime::now_utc();
    let started = Instant::now();
    let step = progress::Progress::detect(ui.quiet).start(&format!(
        "building the {} image {} from {}",
        r.agent,
        r.tag(),
        r.source
    ));
    let worker = std::thread::spawn(move || exec::run_to_log(&inv, &log));
    // Read as it grows, a bounded chunk at a time: the guest writes this
    // output, and ppp's memory must not follow it.
    let mut pos = from;
    let mut partial = String::new();
    let mut last_step: Option<String> = None;
    let mut show = |done: bool| {
        loop {
            let (chunk, read) = read_chunk(&log_path, pos, SHOW_CHUNK);
            pos += read;
            partial.push_str(&chunk);
            let cut = if done && read == 0 { partial.len() } else { partial.rfind('\n').map_or(0, |i| i + 1) };
            for line in partial[..cut].lines() {
                if let Some(s) = step_line(line) {
                    last_step = Some(shorten(s, 120));
                    step.println(&format!(
                        "ppp:   {} ({} in)",
                        crate::output::printable(&shorten(s, 100)),
                        progress::elapsed_text(started.elapsed())
                    ));
                }
            }
            partial.drain(..cut);
            // A line without end is kept only up to a bound.
            if u64::try_from(partial.len()).unwrap_or(u64::MAX) > SHOW_CHUNK {
                partial.clear();
            }
            if read == 0 || (!done && read < SHOW_CHUNK) {
                break;
            }
        }
    };
    while !worker.is_finished() {
        show(false);
        std::thread::sleep(Duration::from_millis(200));
    }
    show(true);
    let code = worker.join().map_err(|_| fail("the image build's thread panicked"))??;
    if code == 0 {
        step.done();
        return Ok(());
    }
    drop(step);
    let failure = BuildEnd { output: read_tail(&log_path, from, SHOW_CHUNK), step: last_step, code, since: started_at };
    Err(build_failure(dirs, rec, r, &failure))
}

/// At most `max` bytes of `path` from byte `from`, and how many were read.
fn read_chunk(path: &Path, from: u64, max: u64) -> (String, u64) {
    let Ok(mut f) = std::fs::File::open(path) else { return (String::new(), 0) };
    if f.seek(std::io::SeekFrom::Start(from)).is_err() {
        return (String::new(), 0);
    }
    let mut bytes = Vec::new();
    let _ = f.take(max).read_to_end(&mut bytes);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes.len() as u64)
}

/// The last `max` bytes of what was appended to `path` after byte `from`.
fn read_tail(path: &Path, from: u64, max: u64) -> String {
    let len = std::fs::metadata(path).map_or(from, |m| m.len());
    read_chunk(path, from.max(len.saturating_sub(max)), max).0
}

/// `STEP 3/7: RUN apt-get …` from one line of podman's build output.
fn step_line(line: &str) -> Option<&str> {
    let at = line.find("STEP ")?;
    let rest = &line[at..];
    let (counter, _) = rest["STEP ".len()..].split_once(": ")?;
    let (n, m) = counter.split_once('/')?;
    (n.bytes().all(|b| b.is_ascii_digit()) && m.bytes().all(|b| b.is_ascii_digit())).then_some(rest.trim_end())
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut s: String = text.chars().take(max).collect();
    s.push('…');
    s
}

/// What a failed build left: the end of its output, the last step it
/// started, its exit code, when it started.
struct BuildEnd {
    output: String,
    step: Option<String>,
    code: i32,
    since: OffsetDateTime,
}

/// The error of a failed build: the step it failed at, podman's reason,
/// and the hosts the policy refused meanwhile with the line that allows
/// each.
fn build_failure(dirs: &Dirs, rec: &Record, r: &Recipe, f: &BuildEnd) -> anyhow::Error {
    let (output, code, since, at) = (f.output.as_str(), f.code, f.since, &f.step);
    let why = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("Error:"))
        // `Error: building at STEP "RUN …": while running runtime: exit
        // status 1` names the step again; the reason is what follows.
        .map(|l| {
            let l = l.trim().trim_start_matches("Error:").trim();
            l.strip_prefix("building at STEP").and_then(|r| r.split_once("\": ")).map_or(l, |(_, why)| why).to_owned()
        })
        .map_or_else(|| format!("podman build exited with status {code}"), |l| shorten(&l, 200));
    let refused = refused_hosts(dirs, &rec.name, since);
    let mut msg = format!("building the {} image failed", r.agent);
    if let Some(at) = &at {
        let _ = write!(msg, " at {at}");
    }
    let _ = write!(msg, ": {why}");
    let log = dirs.sandbox_machine_log(&rec.name);
    let hint = if refused.is_empty() {
        format!(
            "see the build's output in `{}`; ppp's own Containerfiles need {} (docs/images.md)",
            log.display(),
            BUILD_HOSTS.join(", ")
        )
    } else {
        let list: Vec<String> = refused.iter().map(|h| format!("`{h}`")).collect();
        let _ = write!(msg, "; the policy refused {} during the build", list.join(", "));
        let allow: Vec<String> = refused.iter().map(|h| format!("`ppp policy allow network {h}`")).collect();
        format!(
            "allow what the build needs with {}, then create the sandbox again (log: `{}`)",
            allow.join(" and "),
            log.display()
        )
    };
    fail(msg).hint(hint).into()
}

/// Hosts (or addresses) the proxy refused for `sandbox` since `since`,
/// from flows.jsonl, in the order first refused. Only names that are
/// plain hostnames or addresses are offered: the guest chose them, and a
/// user may paste the suggested command.
fn refused_hosts(dirs: &Dirs, sandbox: &str, since: OffsetDateTime) -> Vec<String> {
    // The addon logs a refusal as it answers it; give the line a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let found = refused_in_log(dirs, sandbox, since);
        if !found.is_empty() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn refused_in_log(dirs: &Dirs, sandbox: &str, since: OffsetDateTime) -> Vec<String> {
    let since = since - Duration::from_secs(1);
    let flows = crate::policy::flowlog::tail(&dirs.flows_log(), REFUSAL_FLOWS, Some(sandbox)).unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for f in flows {
        if f["decision"] != "deny" {
            continue;
        }
        let at = f["timestamp"]
            .as_str()
            .and_then(|t| OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok());
        if at.is_none_or(|t| t < since) {
            continue;
        }
        let Some(host) = f["host"].as_str().filter(|h| !h.is_empty()).or_else(|| f["ip"].as_str()) else {
            continue;
        };
        let host = host.to_ascii_lowercase();
        if plain_target(&host) && !out.contains(&host) {
            out.push(host);
        }
        if out.len() >= 5 {
            break;
        }
    }
    out
}

/// A hostname or IPv4/IPv6 address, nothing a shell or the policy's rule
/// syntax would read more into (`*`, `/`, spaces, quotes).
fn plain_target(host: &str) -> bool {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// `cat` the VM's archive into `dst` over ssh.
fn cat_out(dirs: &Dirs, podman: &Podman, rec: &Record, dst: &Path) -> Result<()> {
    let inv = podman.ssh(&rec.machine_name, &["cat", &guest_archive()]).timeout(COPY_TIMEOUT);
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)
        .with_context(|| format!("could not create `{}`", dst.display()))?;
    let log = open_log(dirs, &rec.name)?;
    let _ = writeln!(&log, "$ {inv} > {}", dst.display());
    let code = exec::run_to_file(&inv, &out, &log)?;
    if code != 0 {
        return Err(fail(format!("copying the image out of the VM failed (`{inv}` exited with status {code})"))
            .hint(format!("see `{}`", dirs.sandbox_machine_log(&rec.name).display()))
            .into());
    }
    Ok(())
}

/// A temp file removed when dropped (forgotten once it is renamed).
struct Staged<'a>(&'a Path);

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Save the image built in the VM to the host's cache: the archive is
/// copied to a temp file, checked against the size bound, digested, moved
/// into place, and only then is its digest file written.
fn save(dirs: &Dirs, podman: &Podman, rec: &Record, r: &Recipe, ui: Ui) -> Result<()> {
    let machine = &rec.machine_name;
    let cache = dirs.image_cache();
    state::create_private_dir(&cache)?;
    let tmp = cache.join(format!(".tmp-{}-{}.oci.tar", r.agent, uuid::Uuid::new_v4().simple()));
    // Before podman 5.5 (no `machine cp`) the archive comes out as ssh's
    // standard output, the way `copy_in` sends files in.
    let copy_out = podman.copy_out(machine, &guest_archive(), &tmp);
    ui.timed(&format!("saving the {} image to `{}`", r.agent, cache.display()), || {
        let _lock = state::Lock::acquire(&dirs.image_archive_lock(r.agent, r.short()))?;
        // Removed on every way out but the rename.
        let staged = Staged(&tmp);
        let saved = run_logged(
            dirs,
            &rec.name,
            &podman
                .ssh(machine, &["podman", "save", "--format", "oci-archive", "--output", &guest_archive(), &r.tag()])
                .timeout(COPY_TIMEOUT),
            "saving the image in the VM",
        )
        .and_then(|()| match &copy_out {
            Some(inv) => {
                run_logged(dirs, &rec.name, &inv.clone().timeout(COPY_TIMEOUT), "copying the image out of the VM")
            }
            None => cat_out(dirs, podman, rec, &tmp),
        });
        let _ = exec::run(&podman.ssh(machine, &["rm", "-f", &guest_archive()]));
        saved?;
        let bytes = std::fs::metadata(staged.0).with_context(|| format!("could not read `{}`", tmp.display()))?.len();
        if bytes > MAX_ARCHIVE_BYTES {
            return Err(fail(format!(
                "the saved image has {bytes} bytes, more than the {MAX_ARCHIVE_BYTES} ppp keeps"
            ))
            .into());
        }
        let digest = sha256_file(staged.0)?;
        // No digest file for the old archive while the new one moves in.
        let sum = dirs.image_archive_sum(r.agent, r.short());
        let _ = std::fs::remove_file(&sum);
        state::persist_file(staged.0, &dirs.image_archive(r.agent, r.short()))?;
        std::mem::forget(staged);
        state::write_atomic(&sum, format!("sha256:{digest} {bytes}\n").as_bytes())?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(text: &str) -> Recipe {
        Recipe::new("opencode", text.as_bytes().to_vec(), "test".into())
    }

    #[test]
    fn the_tag_follows_the_containerfile() {
        let a = recipe("FROM x\n");
        assert_eq!(a, recipe("FROM x\n"));
        assert_ne!(a.tag(), recipe("FROM x\nRUN true\n").tag(), "a changed Containerfile builds a new image");
        assert!(a.tag().starts_with("localhost/ppp/opencode:") && a.short().len() == 16, "{}", a.tag());
    }

    #[test]
    fn the_build_line_mounts_the_ca_and_bakes_nothing() {
        let line = build_argv(&recipe("FROM x\n")).join(" ");
        assert!(line.starts_with("podman build --tag localhost/ppp/opencode:"), "{line}");
        assert!(line.contains("--volume /var/lib/ppp/ca-bundle.pem:/run/ppp-build/ca.pem:ro"), "{line}");
        for v in BUILD_CA_VARS {
            assert!(line.contains(&format!("--build-arg {v}=/run/ppp-build/ca.pem")), "{line}");
        }
        // `--env` would put the variables in the image's config.
        assert!(!line.contains("--env"), "{line}");
        assert!(line.ends_with(" /tmp/ppp/build"), "{line}");
    }

    #[test]
    fn every_embedded_containerfile_declares_the_ca_arguments() {
        for a in crate::agent::AGENTS {
            let text = String::from_utf8(a.embedded_containerfile()).unwrap();
            let from = text.lines().position(|l| l.starts_with("FROM ")).unwrap();
            for v in BUILD_CA_VARS {
                let at = text.lines().position(|l| l == format!("ARG {v}")).unwrap_or_else(|| panic!("{v}"));
                assert!(at > from, "{}: ARG {v} must follow FROM to reach the RUN steps", a.containerfile);
            }
            assert!(!text.contains("published"), "{}: nothing publishes ppp's images", a.containerfile);
        }
    }

    #[test]
    fn steps_are_read_from_podman_output() {
        assert_eq!(step_line("STEP 2/5: RUN apt-get update"), Some("STEP 2/5: RUN apt-get update"));
        assert_eq!(step_line("[2/3] STEP 1/4: FROM x"), Some("STEP 1/4: FROM x"));
        assert_eq!(step_line("Error: building at STEP \"RUN x\": exit status 1"), None);
        assert_eq!(step_line("STEPS 1/2: x"), None);
    }

    #[test]
    fn only_plain_hosts_are_suggested() {
        for ok in ["deb.debian.org", "registry-1.docker.io", "192.0.2.1", "2001:db8::1"] {
            assert!(plain_target(ok), "{ok}");
        }
        for bad in ["", "*.evil.test", "a b", "x;rm -rf ~", "a..b", "-a.b", "a/b", "`x`", "h\u{202e}x", "ex%41mple"] {
            assert!(!plain_target(bad), "{bad:?}");
        }
    }

    #[test]
    fn digest_files_parse_strictly() {
        let hex = "a".repeat(64);
        assert_eq!(parse_sum(&format!("sha256:{hex} 12\n")), Some((hex.clone(), 12)));
        assert_eq!(parse_sum(&format!("sha256:{hex}")), None);
        assert_eq!(parse_sum(&format!("md5:{hex} 12")), None);
        assert_eq!(parse_sum("sha256:abc 12"), None);
        assert_eq!(parse_sum(&format!("sha256:{hex} -1")), None);
    }

    #[test]
    fn a_cache_is_trusted_only_when_size_and_digest_match() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs { config: tmp.path().join("c"), data: tmp.path().join("d"), cache: tmp.path().join("k") };
        let r = recipe("FROM x\n");
        assert_eq!(verify(&dirs, &r), Cached::Missing);
        let archive = dirs.image_archive(r.agent, r.short());
        let sum = dirs.image_archive_sum(r.agent, r.short());
        std::fs::create_dir_all(dirs.image_cache()).unwrap();
        std::fs::write(&archive, b"archive bytes").unwrap();
        assert!(matches!(verify(&dirs, &r), Cached::Corrupt(w) if w.contains("missing")), "no digest file");
        let digest = sha256_file(&archive).unwrap();
        std::fs::write(&sum, format!("sha256:{digest} 13\n")).unwrap();
        assert_eq!(verify(&dirs, &r), Cached::Valid { bytes: 13 });
        // Cut off: the size says so before any digest is computed.
        std::fs::write(&archive, b"archive").unwrap();
        assert!(matches!(cache_state(&dirs, &r), Cached::Corrupt(w) if w.contains("not the 13")));
        // Same size, other bytes: only the digest tells.
        std::fs::write(&archive, b"ARCHIVE bytes").unwrap();
        assert_eq!(cache_state(&dirs, &r), Cached::Valid { bytes: 13 });
        assert!(matches!(verify(&dirs, &r), Cached::Corrupt(w) if w.contains("digest")));
        discard(&dirs, &r);
        assert_eq!(verify(&dirs, &r), Cached::Missing);
        assert!(!sum.exists());
    }
}
