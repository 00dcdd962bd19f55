//! `ppp template save|load|ls|rm`: save a sandbox's machine disk as a
//! template, move it between hosts as a tar, list and remove templates.
//! The index and disk files belong to [`crate::template`]; this file only
//! drives the steps and prints.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use time::OffsetDateTime;

use super::Ctx;
use crate::cli::TemplateCommand;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec;
use crate::podman::Podman;
use crate::sandbox::{self, lifecycle, machine};
use crate::template::{self, Index, Staged, Template};

/// Run `ppp template …`.
pub fn run(cmd: &TemplateCommand, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    match cmd {
        TemplateCommand::Save { sandbox, tag, output, force } => {
            save(dirs, ctx, sandbox, tag, output.as_deref(), *force)
        }
        TemplateCommand::Load { file } => load(dirs, ctx, file),
        TemplateCommand::Ls { json, quiet } => ls(dirs, *json, *quiet),
        TemplateCommand::Rm { tag } => {
            let t = template::remove(dirs, tag)?;
            crate::output::println(&format!("removed template `{}` ({})", t.tag, t.id))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn save(dirs: &Dirs, ctx: &Ctx, name: &str, tag: &str, out: Option<&Path>, force: bool) -> Result<ExitCode> {
    template::validate_tag(tag)?;
    let rec = sandbox::load(dirs, name)?
        .ok_or_else(|| fail(format!("no sandbox named `{name}`")).hint("list sandboxes with `ppp ls`").code(2))?;
    // From before the stop until the copy is whole: nothing may start the
    // machine (`ppp run --name` refuses meanwhile) or save it twice at once.
    let _disk = machine::disk_lease(dirs, name)?;
    let podman = sandbox::podman_for(&Podman::detect()?, dirs, &rec);
    let running = machine::list(&podman)?.into_iter().any(|m| m.name == rec.machine_name && (m.running || m.starting));
    if running {
        // A running machine's disk changes under qemu-img: stop it first.
        if !force
            && !crate::output::confirm_or(
                &format!("sandbox `{name}` is running; stop it to save its disk?"),
                &format!("`ppp template save -f {name} {tag}`"),
            )?
        {
            return Ok(ExitCode::from(1));
        }
        lifecycle::stop(dirs, &podman, name, ctx.ui())?;
    }
    let inspect = exec::run(&podman.inspect(&rec.machine_name))?;
    let src = template::image_path_from_config(&inspect.stdout).map_err(|why| {
        fail(format!("could not find the disk of machine `{}`: {why}", rec.machine_name)).hint(format!(
            "ppp reads `ImagePath` from the machine config `<ConfigDir>/<name>.json` that `podman machine inspect {}` \
             points at (podman 5 and later)",
            rec.machine_name
        ))
    })?;
    let src_size = fs_err::metadata(&src)
        .map(|m| m.len())
        .with_context(|| fail(format!("the disk of machine `{}` cannot be read", rec.machine_name)))?;

    let staged = Staged::new(dirs, "save")?;
    let step = ctx.progress().transfer(&format!("saving `{name}` as template `{tag}`"), src_size);
    exec::run(&template::convert(&src, staged.path())).map_err(|e| {
        anyhow::Error::new(e).context(
            fail(format!("could not save template `{tag}`"))
                .hint(format!("check the free space in `{}`", dirs.templates().display())),
        )
    })?;
    step.advance(src_size / 2);
    let size = fs_err::metadata(staged.path())?.len();
    let sha256 = template::sha256_file(staged.path(), &|_| {})?;
    step.advance(src_size - src_size / 2);
    let t = Template {
        tag: tag.to_owned(),
        id: template::id_of(&sha256),
        source: Some(rec.name.clone()),
        agent: Some(rec.agent.clone()),
        size,
        sha256,
        created_at: now(),
    };
    let old = template::register(dirs, staged.path(), &t)?;
    step.done();
    if let Some(o) = old {
        eprintln!("ppp: tag `{tag}` moved from template {} to {}", o.id, t.id);
    }
    if let Some(out) = out {
        export(dirs, ctx, &t, out)?;
    }
    crate::output::println(&format!("saved template `{tag}` ({}, {})", t.id, size_text(t.size)))?;
    Ok(ExitCode::SUCCESS)
}

/// Write `out` as a tar of the disk and its metadata: packed to a temp name
/// beside `out`, then renamed.
fn export(dirs: &Dirs, ctx: &Ctx, t: &Template, out: &Path) -> Result<()> {
    let step = ctx.progress().transfer(&format!("exporting template `{}` to `{}`", t.tag, out.display()), t.size);
    let dir = Staged::new(dirs, "export")?;
    state_dir(dir.path())?;
    // A hard link, not a copy: same filesystem, and the disk may be GiBs.
    fs_err::hard_link(t.disk(dirs), dir.path().join(template::DISK))
        .or_else(|_| fs_err::copy(t.disk(dirs), dir.path().join(template::DISK)).map(|_| ()))?;
    fs_err::write(dir.path().join(template::META), serde_json::to_vec_pretty(t)?)?;
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let file = out.file_name().ok_or_else(|| fail(format!("`{}` is not a file name", out.display())).code(2))?;
    let tmp = parent.join(format!(".{}.{}.tmp", file.to_string_lossy(), uuid::Uuid::new_v4().simple()));
    let packed = exec::run(&template::pack(&tmp, dir.path(), &[template::META, template::DISK]))
        .map_err(anyhow::Error::new)
        .and_then(|_| crate::state::persist_file(&tmp, out));
    if let Err(e) = packed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(fail(format!("could not export template `{}` to `{}`", t.tag, out.display()))));
    }
    step.advance(t.size);
    step.done();
    Ok(())
}

fn load(dirs: &Dirs, ctx: &Ctx, file: &Path) -> Result<ExitCode> {
    let not_template = |why: String| -> anyhow::Error {
        fail(format!("`{}` is not a ppp template: {why}", file.display()))
            .hint("pass a file written by `ppp template save -o FILE`")
            .into()
    };
    if !file.is_file() {
        return Err(fail(format!("`{}` does not exist", file.display())).code(2).into());
    }
    let listing = exec::run(&template::list(file)).map_err(|e| not_template(e.to_string()))?;
    let mut members: Vec<&str> = listing.stdout.lines().map(|l| l.trim_start_matches("./")).collect();
    members.sort_unstable();
    if members != [template::DISK, template::META] {
        return Err(not_template(format!("it holds {members:?}, not `{}` and `{}`", template::DISK, template::META)));
    }
    let dir = Staged::new(dirs, "load")?;
    state_dir(dir.path())?;
    exec::run(&template::unpack(file, dir.path(), &[template::META, template::DISK])).map_err(|e| {
        anyhow::Error::new(e).context(
            fail(format!("could not unpack `{}`", file.display()))
                .hint(format!("check the free space in `{}`", dirs.templates().display())),
        )
    })?;
    // Both must be plain files with one name: a symlink or hard link would
    // make the checksum and the import read some other file.
    for member in [template::META, template::DISK] {
        let m = fs_err::symlink_metadata(dir.path().join(member))?;
        if !m.file_type().is_file() || std::os::unix::fs::MetadataExt::nlink(&m) != 1 {
            return Err(not_template(format!("`{member}` is not a regular file")));
        }
    }
    let meta_path = dir.path().join(template::META);
    let meta: Template = serde_json::from_slice(&fs_err::read(&meta_path)?)
        .map_err(|e| not_template(format!("`{}`: {e}", template::META)))?;
    template::validate_tag(&meta.tag)?;
    let disk = dir.path().join(template::DISK);
    let size = fs_err::metadata(&disk)?.len();
    let step = ctx.progress().transfer(&format!("checking template `{}`", meta.tag), size);
    let sha256 = template::sha256_file(&disk, &|n| step.advance(n))?;
    if sha256 != meta.sha256 || size != meta.size {
        return Err(fail(format!(
            "the disk in `{}` does not match its checksum: expected sha256 {} ({} bytes), found {sha256} ({size} bytes)",
            file.display(),
            meta.sha256,
            meta.size
        ))
        .hint("the file is damaged or was changed; export it again with `ppp template save -o`")
        .into());
    }
    let info = exec::run(&template::info(&disk)).map_err(|e| not_template(e.to_string()))?;
    if let Some(why) = template::unsafe_disk(&info.stdout) {
        return Err(not_template(why));
    }
    exec::run(&template::check(&disk)).map_err(|e| not_template(e.to_string()))?;
    let t = Template { id: template::id_of(&sha256), sha256, size, ..meta };
    let old = template::register(dirs, &disk, &t)?;
    step.done();
    if let Some(o) = old {
        eprintln!("ppp: tag `{}` moved from template {} to {}", t.tag, o.id, t.id);
    }
    crate::output::println(&format!("loaded template `{}` ({}, {})", t.tag, t.id, size_text(t.size)))?;
    Ok(ExitCode::SUCCESS)
}

fn ls(dirs: &Dirs, json: bool, quiet: bool) -> Result<ExitCode> {
    let index = Index::load(dirs)?;
    if json {
        let rows: Vec<serde_json::Value> = index
            .templates
            .iter()
            .map(|t| {
                let mut v = serde_json::to_value(t).unwrap_or_default();
                v["path"] = t.disk(dirs).display().to_string().into();
                v
            })
            .collect();
        crate::output::json(&rows)?;
        return Ok(ExitCode::SUCCESS);
    }
    if quiet {
        let mut tags = String::new();
        for t in &index.templates {
            tags.push_str(&t.tag);
            tags.push('\n');
        }
        crate::output::print(&tags)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = index
        .templates
        .iter()
        .map(|t| {
            vec![
                t.tag.clone(),
                t.id.clone(),
                t.agent.clone().unwrap_or_else(|| "-".into()),
                t.source.clone().unwrap_or_else(|| "-".into()),
                size_text(t.size),
                t.created_at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
            ]
        })
        .collect();
    crate::output::print(&crate::output::table(&["TAG", "ID", "AGENT", "SOURCE", "SIZE", "CREATED"], &rows))?;
    Ok(ExitCode::SUCCESS)
}

fn state_dir(dir: &Path) -> Result<()> {
    crate::state::create_private_dir(dir)
}

fn now() -> OffsetDateTime {
    let t = OffsetDateTime::now_utc();
    t.replace_nanosecond(0).unwrap_or(t)
}

/// Bytes in binary units, one decimal (`1.5 GiB`).
fn size_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    #[allow(clippy::cast_precision_loss, reason = "a size shown to one decimal")]
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}
