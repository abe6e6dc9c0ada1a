//! The deployment files agree with the defaults and with each other: every
//! stop grace (systemd, compose, Kubernetes) is longer than the agents'
//! ordered handoff may take (`manager.agent_shutdown_timeout`), the ports
//! they publish and probe are the ones their configs listen on, the
//! configs they carry parse, the probes are `/readyz` and `/healthz`, and
//! the systemd unit passes `systemd-analyze verify` where it is installed.

use std::path::Path;
use std::time::Duration;

use regex::Regex;
use tailrace::config::Config;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)).unwrap()
}

/// The first capture of `pattern` in `text`.
fn find(text: &str, pattern: &str) -> String {
    let re = Regex::new(pattern).unwrap();
    re.captures(text).unwrap_or_else(|| panic!("no match for {pattern}")).get(1).unwrap().as_str().to_string()
}

fn handoff() -> Duration {
    Config::default().manager.agent_shutdown_timeout
}

fn port(address: &str) -> u16 {
    address.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn the_systemd_unit_waits_out_a_handoff_and_runs_unprivileged() {
    let unit = read("cluster-config/systemd/tailrace-node.service");
    let stop: u64 = find(&unit, r"(?m)^TimeoutStopSec=(\d+)$").parse().unwrap();
    assert!(Duration::from_secs(stop) > handoff(), "TimeoutStopSec={stop} s, handoff {:?}", handoff());
    assert_eq!(find(&unit, r"(?m)^Restart=(\S+)$"), "on-failure");
    assert_eq!(find(&unit, r"(?m)^KillSignal=(\S+)$"), "SIGTERM");
    assert_ne!(find(&unit, r"(?m)^User=(\S+)$"), "root");
    let files: usize = find(&unit, r"(?m)^LimitNOFILE=(\d+)$").parse().unwrap();
    assert!(files > 10_000 + Config::default().edge.log_stream.max_active_connections, "LimitNOFILE={files}");
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let Ok(version) = std::process::Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed: skipped");
        return;
    };
    assert!(version.status.success());
    // The unit as installed, with the binary this test built.
    let dir = tempfile::tempdir().unwrap();
    let unit = read("cluster-config/systemd/tailrace-node.service")
        .replace("/usr/local/bin/tailrace", env!("CARGO_BIN_EXE_tailrace"));
    let path = dir.path().join("tailrace-node.service");
    std::fs::write(&path, unit).unwrap();
    let out = std::process::Command::new("systemd-analyze").arg("verify").arg(&path).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // Only what concerns the unit itself (a container without systemd as
    // PID 1 may complain about the machine).
    let about_unit: Vec<&str> = said.lines().filter(|l| l.contains("tailrace-node.service")).collect();
    assert!(about_unit.is_empty(), "{said}");
}

#[test]
fn compose_waits_out_a_handoff_publishes_what_its_nodes_listen_on_and_their_configs_parse() {
    let compose = read("compose.yaml");
    let grace: u64 = find(&compose, r"stop_grace_period: (\d+)s").parse().unwrap();
    assert!(Duration::from_secs(grace) > handoff(), "stop_grace_period {grace} s, handoff {:?}", handoff());
    let configs = compose.split("\nconfigs:\n").nth(1).unwrap();
    for n in 1..=3 {
        let block = configs.split(&format!("  node-{n}:\n    content: |\n")).nth(1).unwrap();
        let text: String = block
            .lines()
            .take_while(|l| l.starts_with("      "))
            .map(|l| format!("{}\n", &l[6..]))
            .collect::<String>()
            .replace(&find(block, r#"(\$\{TAILRACE_TOKEN[^}]*\})"#), "a-token-of-at-least-16-characters");
        let config = Config::from_toml(&text, &format!("compose node-{n}")).unwrap();
        assert_eq!(config.node.name, format!("node-{n}"));
        let published = find(&compose, &format!(r#""127\.0\.0\.1:858{n}:(\d+)""#));
        assert_eq!(published.parse::<u16>().unwrap(), config.edge.listen.port(), "node-{n}'s published edge port");
        let advertise = config.cluster.advertise.clone().unwrap();
        assert_eq!(port(&advertise), port(&config.cluster.listen), "node-{n} advertises its cluster port");
    }
    let dockerfile = read("Dockerfile");
    let probe = find(&dockerfile, r"HEALTHCHECK[^\n]*\n\s*CMD curl -fsS (\S+)");
    assert_eq!(probe, "http://127.0.0.1:8585/readyz");
}

#[test]
fn kubernetes_waits_out_a_handoff_and_its_ports_probes_and_config_agree() {
    let manifest = read("cluster-config/kubernetes/tailrace.yaml");
    let grace: u64 = find(&manifest, r"terminationGracePeriodSeconds: (\d+)").parse().unwrap();
    assert!(Duration::from_secs(grace) > handoff(), "terminationGracePeriodSeconds {grace}, handoff {:?}", handoff());
    let template: String = manifest
        .split("node.toml.in: |\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("    "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    let text = template.replace("@POD@", "tailrace-0").replace("@TOKEN@", "a-token-of-at-least-16-characters");
    let config = Config::from_toml(&text, "the Kubernetes ConfigMap").unwrap();
    let container = |name: &str| find(&manifest, &format!(r"\{{ name: {name}, containerPort: (\d+) \}}"));
    assert_eq!(container("edge").parse::<u16>().unwrap(), config.edge.listen.port());
    assert_eq!(container("cluster").parse::<u16>().unwrap(), port(&config.cluster.listen));
    let peers = manifest.split("name: tailrace-peers\nspec:").nth(1).unwrap();
    assert_eq!(find(peers, r"name: cluster\n\s+port: (\d+)").parse::<u16>().unwrap(), port(&config.cluster.listen));
    assert!(config.cluster.removed_settings().is_empty(), "the manifest sets no removed setting");
    assert!(!manifest.contains("8588"), "one node-to-node port");
    let advertise = config.cluster.advertise.clone().unwrap();
    assert_eq!(advertise, format!("tailrace-0.tailrace-peers:{}", port(&config.cluster.listen)));
    // This release cannot run beside an older one (docs/upgrading.md): a
    // new image must not roll the pods one by one.
    assert_eq!(find(&manifest, r"updateStrategy:\n\s+type: (\w+)"), "OnDelete");
    assert_eq!(find(&manifest, r"readinessProbe:\n\s+httpGet: \{ path: (\S+), port: edge \}"), "/readyz");
    assert_eq!(find(&manifest, r"livenessProbe:\n\s+httpGet: \{ path: (\S+), port: edge \}"), "/healthz");
}
