//! The `sluice` binary: command line, configuration, and the offline commands.
//!
//! - `sluice check [--dump] [--data-dir DIR] FILE`: validate a DDL script against an empty (or a
//!   copied) catalog, print each statement's outcome and, with `--dump`, the system tables.
//! - `sluice apply --data-dir DIR FILE`: apply a DDL script to a data dir, durably, statement by
//!   statement; stops at the first error.

mod config;
mod dump;
mod machine;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use sluice_catalog::{config_layer, Catalog, DiskStorage};
use sluice_sched::Machine;
use sluice_sql::parse_script;

use crate::config::Config;

#[derive(Debug, Parser)]
#[command(name = "sluice", version, about = "A workload manager for SQL")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a DDL script offline and print each statement's outcome.
    Check {
        /// Also print system.workloads, system.resources and system.scheduler afterwards.
        #[arg(long)]
        dump: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Apply a DDL script to a data dir, persisting each statement; stops at the first error.
    Apply {
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, Args)]
struct Common {
    /// The script; `-` reads standard input.
    file: PathBuf,
    /// `check`: start from a copy of this data dir's catalog (left untouched).
    /// `apply`: the data dir to change (default ./sluice-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A sluice.toml whose `[catalog] statements` form the read-only layer.
    #[arg(long)]
    config: Option<PathBuf>,
    /// CPU cores that `*_ratio_to_cores` and `max_cpu_share` resolve against.
    #[arg(long)]
    cores: Option<u32>,
    /// Memory in bytes that `max_memory_ratio` resolves against.
    #[arg(long)]
    memory: Option<u64>,
}

struct Setup {
    script: String,
    catalog: Catalog,
    storage: Option<DiskStorage>,
    machine: Machine,
}

impl Common {
    /// Reads the config, the script and the catalog. `writable`: open the data dir for writing
    /// (`apply`); otherwise it is only read and left exactly as it was (`check`).
    fn setup(&self, default_data_dir: Option<&Path>, writable: bool) -> anyhow::Result<Setup> {
        let config = match &self.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        let mut script = String::new();
        if self.file.as_os_str() == "-" {
            std::io::stdin()
                .read_to_string(&mut script)
                .context("cannot read standard input")?;
        } else {
            script = std::fs::read_to_string(&self.file)
                .with_context(|| format!("cannot read {}", self.file.display()))?;
        }
        let base = config_layer(&config.catalog.statements).map_err(|e| anyhow::anyhow!("{e}"))?;
        let data_dir = self
            .data_dir
            .clone()
            .or(config.server.data_dir.clone())
            .or(default_data_dir.map(Path::to_path_buf));
        let (catalog, storage) = match data_dir {
            Some(dir) => {
                let storage = if writable {
                    DiskStorage::open(&dir)
                } else {
                    DiskStorage::open_read_only(&dir)
                }
                .map_err(|e| anyhow::anyhow!("{e}"))?;
                let catalog = storage.load(base).map_err(|e| anyhow::anyhow!("{e}"))?;
                (catalog, Some(storage))
            }
            None => (base, None),
        };
        let detected = machine::detect();
        let machine = Machine {
            cores: self.cores.or(config.server.cores).unwrap_or(detected.cores),
            memory: self
                .memory
                .or(config.server.memory)
                .unwrap_or(detected.memory),
        };
        Ok(Setup {
            script,
            catalog,
            storage,
            machine,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check { dump, common } => {
            let setup = common.setup(None, false)?;
            let mut catalog = setup.catalog;
            let mut all_ok = true;
            let mut out = String::new();
            for item in parse_script(&setup.script) {
                out.push_str(&format!(">> {}\n", item.text));
                match item.result.and_then(|stmt| catalog.apply_mut(&stmt)) {
                    Ok(_) => out.push_str("OK\n"),
                    Err(e) => {
                        all_ok = false;
                        out.push_str(&format!("ERROR {}: {e}\n", e.code.name()));
                    }
                }
            }
            if dump {
                out.push_str(
                    &dump::dump(&catalog, setup.machine).map_err(|e| anyhow::anyhow!("{e}"))?,
                );
            }
            print!("{out}");
            Ok(if all_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Apply { common } => {
            let setup = common.setup(Some(Path::new("sluice-data")), true)?;
            let storage = setup.storage.context("apply needs a data dir")?;
            let mut catalog = setup.catalog;
            for item in parse_script(&setup.script) {
                println!(">> {}", item.text);
                let applied =
                    item.result
                        .and_then(|stmt| catalog.apply(&stmt))
                        .and_then(|(next, change)| {
                            if let Some(change) = &change {
                                storage.persist(change)?;
                            }
                            Ok(next)
                        });
                match applied {
                    Ok(next) => {
                        catalog = next;
                        println!("OK");
                    }
                    Err(e) => {
                        println!("ERROR {}: {e}", e.code.name());
                        return Ok(ExitCode::from(1));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
