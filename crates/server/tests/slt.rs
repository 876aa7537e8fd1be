//! sqllogictest files (`tests/slt/*.slt`) run twice over the wire: once with the simple query
//! protocol (psql's), once with the extended protocol (Parse/Bind/Execute, what drivers use,
//! results in binary). Each run gets a fresh server and data dir. Errors are matched against
//! `SQLSTATE: message`, so a record can expect either.

mod support;

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType};
use support::TestServer;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage};

#[derive(Debug)]
struct SltError(String);

impl std::fmt::Display for SltError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SltError {}

impl From<tokio_postgres::Error> for SltError {
    fn from(e: tokio_postgres::Error) -> Self {
        SltError(match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => e.to_string(),
        })
    }
}

struct Wire {
    client: Client,
    extended: bool,
}

/// Binary values of the types tokio-postgres has no text form for, printed like psql.
struct Binary {
    text: String,
}

impl<'a> tokio_postgres::types::FromSql<'a> for Binary {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let text = match *ty {
            Type::INTERVAL => {
                let micros = i64::from_be_bytes(raw[0..8].try_into()?);
                let days = i32::from_be_bytes(raw[8..12].try_into()?);
                let months = i32::from_be_bytes(raw[12..16].try_into()?);
                let mut parts = Vec::new();
                let (years, months) = (months / 12, months % 12);
                let unit = |n: i32, one: &str, many: &str| {
                    format!("{n} {}", if n == 1 { one } else { many })
                };
                if years != 0 {
                    parts.push(unit(years, "year", "years"));
                }
                if months != 0 {
                    parts.push(unit(months, "mon", "mons"));
                }
                if days != 0 {
                    parts.push(unit(days, "day", "days"));
                }
                if micros != 0 || parts.is_empty() {
                    let secs = micros / 1_000_000;
                    parts.push(format!(
                        "{:02}:{:02}:{:02}",
                        secs / 3600,
                        secs % 3600 / 60,
                        secs % 60
                    ));
                }
                parts.join(" ")
            }
            Type::INT8_ARRAY => array_text(Vec::<Option<i64>>::from_sql(ty, raw)?),
            Type::FLOAT8_ARRAY => array_text(Vec::<Option<f64>>::from_sql(ty, raw)?),
            _ => array_text(
                Vec::<Option<String>>::from_sql(ty, raw)?
                    .into_iter()
                    .map(|v| {
                        v.map(|s| {
                            if s.is_empty() || s.contains([' ', ',', '"', '{', '}']) {
                                format!("\"{}\"", s.replace('"', "\\\""))
                            } else {
                                s
                            }
                        })
                    })
                    .collect(),
            ),
        };
        Ok(Binary { text })
    }

    fn accepts(ty: &Type) -> bool {
        matches!(
            *ty,
            Type::INTERVAL | Type::INT8_ARRAY | Type::TEXT_ARRAY | Type::FLOAT8_ARRAY
        )
    }
}

fn array_text<T: ToString>(values: Vec<Option<T>>) -> String {
    let items: Vec<String> = values
        .into_iter()
        .map(|v| v.map_or_else(|| "NULL".to_string(), |v| v.to_string()))
        .collect();
    format!("{{{}}}", items.join(","))
}

/// A text cell as sqllogictest writes it: `NULL`, `(empty)`, or the text.
fn cell(v: Option<String>) -> String {
    match v {
        None => "NULL".into(),
        Some(s) if s.is_empty() => "(empty)".into(),
        Some(s) => s,
    }
}

/// A value of a binary-format result column as text, the way the simple protocol shows it.
fn text_of(row: &tokio_postgres::Row, i: usize) -> Result<String, SltError> {
    fn show<T: ToString>(v: Option<T>) -> String {
        v.map_or_else(|| "NULL".to_string(), |v| v.to_string())
    }
    let ty = row.columns()[i].type_().clone();
    let err = |e: tokio_postgres::Error| SltError(format!("column {i} ({ty}): {e}"));
    Ok(match ty {
        Type::BOOL => row
            .try_get::<_, Option<bool>>(i)
            .map_err(err)?
            .map_or("NULL".into(), |b| if b { "t" } else { "f" }.into()),
        Type::INT2 => show(row.try_get::<_, Option<i16>>(i).map_err(err)?),
        Type::INT4 => show(row.try_get::<_, Option<i32>>(i).map_err(err)?),
        Type::INT8 => show(row.try_get::<_, Option<i64>>(i).map_err(err)?),
        Type::FLOAT4 => show(row.try_get::<_, Option<f32>>(i).map_err(err)?),
        Type::FLOAT8 => show(row.try_get::<_, Option<f64>>(i).map_err(err)?),
        Type::NUMERIC => show(
            row.try_get::<_, Option<rust_decimal::Decimal>>(i)
                .map_err(err)?,
        ),
        Type::DATE => show(
            row.try_get::<_, Option<chrono::NaiveDate>>(i)
                .map_err(err)?,
        ),
        Type::TIMESTAMP => show(
            row.try_get::<_, Option<chrono::NaiveDateTime>>(i)
                .map_err(err)?,
        ),
        Type::INTERVAL | Type::INT8_ARRAY | Type::TEXT_ARRAY | Type::FLOAT8_ARRAY => {
            // Decoded here from the binary form, and printed the way Postgres prints them.
            show(
                row.try_get::<_, Option<Binary>>(i)
                    .map_err(err)?
                    .map(|b| b.text),
            )
        }
        _ => cell(row.try_get::<_, Option<String>>(i).map_err(err)?),
    })
}

#[async_trait]
impl AsyncDB for Wire {
    type Error = SltError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        if self.extended {
            let statement = self.client.prepare(sql).await?;
            if statement.columns().is_empty() {
                let n = self.client.execute(&statement, &[]).await?;
                return Ok(DBOutput::StatementComplete(n));
            }
            let rows = self.client.query(&statement, &[]).await?;
            let types = vec![DefaultColumnType::Any; statement.columns().len()];
            let rows = rows
                .iter()
                .map(|row| (0..row.len()).map(|i| text_of(row, i)).collect())
                .collect::<Result<_, _>>()?;
            return Ok(DBOutput::Rows { types, rows });
        }
        let messages = self.client.simple_query(sql).await?;
        let mut rows = Vec::new();
        let mut width = None;
        let mut count = 0;
        for message in messages {
            match message {
                SimpleQueryMessage::RowDescription(columns) => width = Some(columns.len()),
                SimpleQueryMessage::Row(row) => rows.push(
                    (0..row.len())
                        .map(|i| cell(row.get(i).map(str::to_string)))
                        .collect(),
                ),
                SimpleQueryMessage::CommandComplete(n) => count = n,
                _ => {}
            }
        }
        Ok(match width {
            Some(w) => DBOutput::Rows {
                types: vec![DefaultColumnType::Any; w],
                rows,
            },
            None => DBOutput::StatementComplete(count),
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        if self.extended {
            "sluice-extended"
        } else {
            "sluice-simple"
        }
    }

    async fn sleep(dur: std::time::Duration) {
        tokio::time::sleep(dur).await;
    }
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/slt")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files in {}", dir.display());
    files
}

async fn run_all(extended: bool) {
    let mut failures = Vec::new();
    for file in slt_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = TestServer::start(dir.path(), false).await;
        let port = server.port;
        let mut runner = sqllogictest::Runner::new(move || async move {
            let client =
                support::connect(&format!("host=127.0.0.1 port={port} user=slt dbname=slt"))
                    .await?;
            Ok(Wire { client, extended })
        });
        runner.add_label(if extended { "extended" } else { "simple" });
        if let Err(e) = runner.run_file_async(&file).await {
            failures.push(format!("{}: {}", file.display(), e.display(false)));
        }
        server.stop().await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test]
async fn slt_files_pass_with_the_simple_protocol() {
    run_all(false).await;
}

#[tokio::test]
async fn slt_files_pass_with_the_extended_protocol() {
    run_all(true).await;
}
