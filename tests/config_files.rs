//! The configuration files shipped in `cluster-config/` stay valid.

use std::path::Path;

use tailrace::config::Config;

#[test]
fn defaults_toml_is_exactly_the_built_in_defaults() {
    let config = Config::load(Path::new("cluster-config/defaults.toml")).unwrap();
    assert_eq!(config, Config::default());
}

#[test]
fn every_shipped_config_parses() {
    let mut checked = 0;
    for entry in std::fs::read_dir("cluster-config").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
            checked += 1;
        }
    }
    assert!(checked >= 2);
}

/// A writer section that sets one key keeps the adapter's other defaults:
/// it once turned age-based sealing off, and nothing reached a reader
/// until a file filled up.
#[test]
fn a_partial_writer_section_keeps_the_adapters_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small-files.toml");
    std::fs::write(&path, "[adapters.file.writer]\nmax_file_bytes = 2048\n").unwrap();
    let config = Config::load(&path).unwrap();
    let defaults = Config::default().adapters.file.writer;
    assert_eq!(config.adapters.file.writer.max_file_bytes, 2048);
    assert_eq!(config.adapters.file.writer.max_file_age, defaults.max_file_age);
    assert!(defaults.max_file_age.is_some());
    std::fs::write(&path, "[adapters.file.writer]\nmax_file_bytez = 2048\n").unwrap();
    let err = Config::load(&path).unwrap_err().to_string();
    assert!(err.contains("max_file_bytez"), "{err}");
}

/// Dotted paths of the leaves of a TOML table (`edge.log_stream.poll_seconds`).
fn leaf_keys(table: &toml::Table, prefix: &str, into: &mut std::collections::BTreeSet<String>) {
    for (key, value) in table {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match value {
            toml::Value::Table(inner) => leaf_keys(inner, &path, into),
            _ => {
                into.insert(path);
            }
        }
    }
}

/// `defaults.toml` lists every setting the code reads, and only those: the
/// keys of the built-in defaults, serialised, are exactly the file's
/// (settings with no default value, such as the cookie, are documented
/// there as comments).
#[test]
fn defaults_toml_lists_every_setting_and_only_settings() {
    let text = std::fs::read_to_string("cluster-config/defaults.toml").unwrap();
    let file: toml::Table = toml::from_str(&text).unwrap();
    let code = toml::Table::try_from(Config::default()).unwrap();
    let (mut in_file, mut in_code) = (Default::default(), Default::default());
    leaf_keys(&file, "", &mut in_file);
    leaf_keys(&code, "", &mut in_code);
    let missing: Vec<_> = in_code.difference(&in_file).collect();
    let unknown: Vec<_> = in_file.difference(&in_code).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "settings missing from defaults.toml: {missing:?}; keys in defaults.toml the code does not read: {unknown:?}"
    );
    assert!(in_code.len() > 50, "only {} settings found: the comparison saw nothing", in_code.len());
}

/// `docs/configuration.md` describes every setting: each key of the
/// built-in defaults appears there as its full dotted path in backticks.
#[test]
fn the_configuration_reference_names_every_setting() {
    let reference = std::fs::read_to_string("docs/configuration.md").unwrap();
    let code = toml::Table::try_from(Config::default()).unwrap();
    let mut keys = Default::default();
    leaf_keys(&code, "", &mut keys);
    let missing: Vec<_> = keys.iter().filter(|key| !reference.contains(&format!("`{key}`"))).collect();
    assert!(missing.is_empty(), "docs/configuration.md does not describe: {missing:?}");
    assert!(keys.len() > 50, "only {} settings found: the comparison saw nothing", keys.len());
}

/// A copy of `defaults.toml` leaves the balancer to the command (it once
/// said `best-fit`, and a node config made from it quietly ran without
/// leases): one process runs best-fit, `tailrace node` leases.
#[test]
fn defaults_toml_leaves_the_balancer_to_the_command() {
    let config = Config::load(Path::new("cluster-config/defaults.toml")).unwrap();
    assert_eq!(config.balancer, None);
    assert_eq!(config.balancer_kind(), tailrace::config::BalancerKind::BestFit);
    let chosen = Config::from_toml("[balancer]\nkind = \"lease\"\n", "node.toml").unwrap();
    assert_eq!(chosen.balancer_kind(), tailrace::config::BalancerKind::Lease);
}

/// Every value `defaults.toml` shows for the Kafka adapter parses: its
/// commented lines, uncommented, with `records = "mapped"`, make a config
/// that loads (a commented example the code refused would send a user
/// who copied it to a node that does not start).
#[test]
fn the_kafka_sections_commented_values_parse() {
    let text = std::fs::read_to_string("cluster-config/defaults.toml").unwrap();
    let mut section = String::new();
    let mut uncommented = Vec::new();
    let mut out = String::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('[') {
            section = name.split(']').next().unwrap_or_default().to_string();
        }
        let line = match line.strip_prefix("# ") {
            Some(setting) if section.starts_with("adapters.kafka") && setting.contains(" = ") => {
                uncommented.push(setting.split(" = ").next().unwrap_or_default().to_string());
                setting
            }
            _ => line,
        };
        out.push_str(&line.replace("records = \"tailrace\"", "records = \"mapped\""));
        out.push('\n');
    }
    for key in ["default_stream", "pipeline", "run", "sasl_mechanism", "tls_ca_file"] {
        assert!(uncommented.iter().any(|k| k == key), "`{key}` is not shown commented: {uncommented:?}");
    }
    let config = Config::from_toml(&out, "defaults.toml, uncommented").unwrap_or_else(|e| panic!("{e}"));
    let kafka = config.adapters.kafka;
    assert_eq!(kafka.records, tailrace::adapters::kafka::RecordFormat::Mapped);
    assert_eq!(kafka.mapping.pipeline.as_deref(), Some("header:pipeline"));
    assert_eq!(kafka.mapping.default_stream.as_deref(), Some("svc.misc/unnamed"));
}
