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
