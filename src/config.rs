//! `sluice.toml`: the parts the offline commands read. Unknown keys are errors, so a typo
//! stops the start with a message naming the key. See docs/config.md.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub catalog: CatalogConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// The address `sluice serve` listens on; default `127.0.0.1:6543`.
    pub listen: Option<String>,
    /// Queries in a workload the catalog does not know fail with RESOURCE_ACCESS_DENIED
    /// instead of running unlimited; default false.
    pub throw_on_unknown_workload: Option<bool>,
    /// Where the catalog (and later the data) lives; default `./sluice-data`.
    pub data_dir: Option<PathBuf>,
    /// Cores the ratio settings resolve against; default: what the machine has.
    pub cores: Option<u32>,
    /// Memory in bytes the ratio settings resolve against; default: what the machine has.
    pub memory: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogConfig {
    /// `;`-separated CREATE statements: a read-only layer of entities.
    #[serde(default)]
    pub statements: String,
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}
