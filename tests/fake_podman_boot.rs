//! The fake podman boots what systemd boots (issue 22, point 5): at
//! `machine start` the services linked into the `.wants` directory of a
//! target the boot reaches start, in an order systemd could use, and
//! nothing else does: a unit installed but not linked, masked, or wanted by
//! a target the boot never reaches (shutdown, rescue) stays stopped. The
//! netns tests trust the fake for "the kill switch is in force from boot";
//! this is what makes that trust earned. The same checks on a real systemd
//! belong to `tests/e2e_vm.rs`.

#[path = "support/netns.rs"]
mod netns;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use netns::{Topology, describe};

/// One fake podman root in a test host namespace; its machine is removed on
/// drop.
struct Fake {
    root: PathBuf,
    home: PathBuf,
    topo: Topology,
}

impl Fake {
    fn new() -> Self {
        netns::require_root_and_tools();
        let topo = Topology::without_mitmdump(0);
        let root = topo.path().join("root");
        let home = topo.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        Fake { root, home, topo }
    }

    fn podman(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.topo.host_ns()])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-podman/podman"))
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", &self.home)
            .env("FAKE_PODMAN_ROOT", &self.root)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.podman(args);
        assert!(out.status.success(), "podman {args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `machine ssh m -- sudo sh -c SCRIPT`: root in the machine.
    fn root_sh(&self, script: &str) -> String {
        let quoted = format!("sudo sh -c '{}'", script.replace('\'', r"'\''"));
        self.ok(&["machine", "ssh", "m", "--", &quoted])
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.podman(&["machine", "rm", "-f", "m"]);
    }
}

/// A unit file that appends `word` to the boot log when it runs.
fn unit(unit_section: &str, word: &str) -> String {
    format!(
        "[Unit]\n{unit_section}\n[Service]\nType=oneshot\nRemainAfterExit=yes\n\
         ExecStart=/bin/sh -c \"echo {word} >> /var/lib/ppp/boot.log\"\n[Install]\nWantedBy=multi-user.target\n"
    )
}

#[test]
fn the_fake_boots_the_units_systemd_would_in_an_order_systemd_could() {
    let f = Fake::new();
    f.ok(&["machine", "init", "m"]);
    f.ok(&["machine", "start", "m"]);
    let d = "/etc/systemd/system";
    let files: Vec<(String, String)> = vec![
        // The kill switch's shape: no default dependencies, before the
        // network; it closes egress with a table the later units look for.
        (
            format!("{d}/z-killswitch.service"),
            "[Unit]\nDefaultDependencies=no\nBefore=network-pre.target shutdown.target\nWants=network-pre.target\n\
             [Service]\nType=oneshot\nRemainAfterExit=yes\n\
             ExecStart=/bin/sh -c \"nft add table inet boottest && echo killswitch >> /var/lib/ppp/boot.log\"\n"
                .to_owned(),
        ),
        // Ordered after the network, as NetworkManager is: the kill switch
        // must already be in force. Its name sorts before the kill switch's
        // and its directory (multi-user) before sysinit's.
        (
            format!("{d}/a-network.service"),
            "[Unit]\nAfter=network-pre.target\n[Service]\nType=oneshot\n\
             ExecStart=/bin/sh -c \"nft list table inet boottest >/dev/null && echo network-sees-killswitch >> /var/lib/ppp/boot.log || echo network-before-killswitch >> /var/lib/ppp/boot.log\"\n"
                .to_owned(),
        ),
        (format!("{d}/b-plain.service"), unit("", "plain")),
        // Installed but never linked: what provision.sh would leave if it
        // forgot `ln -s`; systemd never starts it.
        (format!("{d}/c-unlinked.service"), unit("", "unlinked")),
        // Linked only into targets a boot does not reach.
        (format!("{d}/d-shutdown.service"), unit("DefaultDependencies=no", "shutdown")),
        (format!("{d}/e-rescue.service"), unit("", "rescue")),
        // An ordering between two units, against their names.
        (format!("{d}/f-second.service"), unit("After=g-first.service", "second")),
        (format!("{d}/g-first.service"), unit("", "first")),
        // A failing step ends the unit (unless it is `-`-prefixed);
        // ExecStartPre runs first.
        (
            format!("{d}/h-steps.service"),
            "[Service]\nType=oneshot\nExecStartPre=/bin/sh -c \"echo pre >> /var/lib/ppp/boot.log\"\n\
             ExecStart=-/bin/false\nExecStart=/bin/sh -c \"echo after-ignored >> /var/lib/ppp/boot.log\"\n\
             ExecStart=/bin/false\nExecStart=/bin/sh -c \"echo after-failure >> /var/lib/ppp/boot.log\"\n"
                .to_owned(),
        ),
        // A drop-in replaces ExecStart= (the empty line resets it).
        (format!("{d}/i-dropin.service"), unit("", "original")),
        (
            format!("{d}/i-dropin.service.d/override.conf"),
            "[Service]\nExecStart=\nExecStart=/bin/sh -c \"echo override >> /var/lib/ppp/boot.log\"\n".to_owned(),
        ),
        // Wanted by a target nothing in the boot reaches, which a booted
        // unit pulls in: then it starts.
        (format!("{d}/j-pulled.service"), unit("", "pulled")),
        (format!("{d}/k-puller.service"), unit("Wants=ppp-test.target", "puller")),
    ];
    let links = [
        ("sysinit.target.wants", "z-killswitch.service"),
        ("multi-user.target.wants", "a-network.service"),
        ("multi-user.target.wants", "b-plain.service"),
        ("shutdown.target.wants", "d-shutdown.service"),
        ("rescue.target.wants", "e-rescue.service"),
        ("multi-user.target.wants", "f-second.service"),
        ("multi-user.target.wants", "g-first.service"),
        ("multi-user.target.wants", "h-steps.service"),
        ("multi-user.target.wants", "i-dropin.service"),
        ("ppp-test.target.wants", "j-pulled.service"),
        ("multi-user.target.wants", "k-puller.service"),
        ("multi-user.target.wants", "l-masked.service"),
    ];
    for (path, text) in &files {
        let dir = Path::new(path).parent().unwrap().display().to_string();
        f.root_sh(&format!("mkdir -p {dir} && cat > {path} <<'UNIT'\n{text}UNIT"));
    }
    for (wants, name) in links {
        let target = if name == "l-masked.service" { "/dev/null".to_owned() } else { format!("../{name}") };
        f.root_sh(&format!("mkdir -p {d}/{wants} && ln -sfn {target} {d}/{wants}/{name}"));
    }
    // Nothing ran yet: linking is not starting.
    f.root_sh("rm -f /var/lib/ppp/boot.log; nft delete table inet boottest 2>/dev/null; true");
    f.ok(&["machine", "stop", "m"]);
    f.ok(&["machine", "start", "m"]);
    let log = f.root_sh("cat /var/lib/ppp/boot.log");
    let ran: Vec<&str> = log.lines().collect();
    let at = |w: &str| ran.iter().position(|r| *r == w).unwrap_or_else(|| panic!("`{w}` did not run at boot: {ran:?}"));
    for never in ["unlinked", "shutdown", "rescue", "original", "after-failure", "network-before-killswitch"] {
        assert!(!ran.contains(&never), "`{never}` ran at boot, as systemd would not: {ran:?}");
    }
    for w in ["killswitch", "network-sees-killswitch", "plain", "pre", "after-ignored", "override", "pulled", "puller"]
    {
        at(w);
    }
    assert!(at("killswitch") < at("network-sees-killswitch"), "the kill switch comes before the network: {ran:?}");
    assert!(at("first") < at("second"), "After= is honoured: {ran:?}");
    assert!(at("pre") < at("after-ignored"), "ExecStartPre= runs first: {ran:?}");
    assert_eq!(ran.len(), 10, "each booted unit ran once: {ran:?}");
    // In force once `machine start` returned, before any guest process.
    f.root_sh("nft list table inet boottest >/dev/null");
    let machine_log = std::fs::read_to_string(f.root.join("machines/m/machine.log")).unwrap_or_default();
    assert!(machine_log.contains("l-masked.service: masked or missing"), "{machine_log}");
}
