//! Strict mode (`sluice check --strict`, `server.strict_clickhouse`): what sluice adds to
//! ClickHouse's dialect is refused the way ClickHouse 26.9 refuses it, so that a script that
//! passes runs unchanged on ClickHouse. The additions: the lane settings ([`crate::lanes`]),
//! `outranked_share`, and classifiers (`CREATE`/`DROP CLASSIFIER`).

use sluice_sql::{EntityKind, Error, ErrorCode, Result, Statement};

use crate::settings::Setting;

/// Refuses `statement` if it uses anything ClickHouse 26.9 lacks: a sluice setting with
/// BAD_ARGUMENTS ("Unknown workload setting", as ClickHouse says), a classifier statement with
/// SYNTAX_ERROR (ClickHouse's parser has no such statement).
pub fn refuse_extensions(statement: &Statement) -> Result<()> {
    match statement {
        Statement::CreateWorkload(w) => {
            let own = w.settings.iter().find(|c| {
                crate::lanes::is_lane_setting(&c.name)
                    || Setting::from_name(&c.name).is_some_and(Setting::is_extension)
            });
            if let Some(c) = own {
                return Err(Error::bad_arguments(format!(
                    "Unknown workload setting '{}' (strict mode: '{}' is sluice's own, ClickHouse 26.9 has no such setting)",
                    c.name, c.name
                )));
            }
            Ok(())
        }
        Statement::CreateClassifier(_) => Err(classifiers_refused("CREATE CLASSIFIER")),
        Statement::Drop(d) if d.kind == EntityKind::Classifier => {
            Err(classifiers_refused("DROP CLASSIFIER"))
        }
        _ => Ok(()),
    }
}

fn classifiers_refused(what: &str) -> Error {
    Error::new(
        ErrorCode::SyntaxError,
        format!("Syntax error: {what} is sluice's own (strict mode: ClickHouse 26.9 has no classifiers; route with SETTINGS workload or [[users]] default_workload instead)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_mode_refuses_what_clickhouse_lacks_as_clickhouse_does() {
        let stmt = |sql: &str| sluice_sql::parse_statement(sql).expect("parses");
        let e = refuse_extensions(&stmt(
            "CREATE WORKLOAD fast IN all SETTINGS priority = 1, demote_after = 5",
        ))
        .expect_err("refused");
        assert_eq!(e.code, ErrorCode::BadArguments);
        assert!(
            e.message
                .starts_with("Unknown workload setting 'demote_after'"),
            "{}",
            e.message
        );
        refuse_extensions(&stmt("CREATE WORKLOAD fast IN all SETTINGS priority = 1"))
            .expect("plain");
        let e = refuse_extensions(&stmt(
            "CREATE WORKLOAD low IN all SETTINGS priority = 2, outranked_share = 0.1 FOR q",
        ))
        .expect_err("refused");
        assert!(
            e.message
                .starts_with("Unknown workload setting 'outranked_share'"),
            "{}",
            e.message
        );
        for sql in [
            "CREATE CLASSIFIER c WORKLOAD w WHEN user = 'a'",
            "DROP CLASSIFIER IF EXISTS c",
        ] {
            assert_eq!(
                refuse_extensions(&stmt(sql)).map_err(|e| e.code),
                Err(ErrorCode::SyntaxError),
                "{sql}"
            );
        }
        refuse_extensions(&stmt("DROP WORKLOAD c")).expect("plain");
    }
}
