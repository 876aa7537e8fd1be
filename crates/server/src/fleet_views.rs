//! The fleet seen as one: `clusterAllReplicas(cluster, system.X)` reads a system table from
//! every live node, and the answers this node gives to the other nodes' requests (its system
//! tables, `KILL QUERY` and `MOVE QUERY` of its statements). Requests go through etcd
//! (`sluice_cluster::Requests`): nodes need no channel to each other.
//!
//! `clusterAllReplicas` is ClickHouse's form, kept for its users: the call (its cluster a
//! string or a name, its table `system.X`, `'system.X'` or `'system', 'X'`) is replaced in the
//! statement's text by `system_fleet.X`, a table this node fills just before the statement
//! runs with its own rows and every other live node's. A node that does not answer within
//! [`ASK_WAIT`] fails the statement, naming it (ClickHouse's default, without
//! `skip_unavailable_shards`). A node alone answers with its own rows.

use std::borrow::Cow;
use std::ops::Range;
use std::time::Duration;

use sluice_engine::datafusion::arrow::record_batch::RecordBatch;
use sluice_sql::lexer::{lex, TokenKind, Tokens};
use sluice_sql::{Error, ErrorCode, Result};

use crate::state::Shared;

/// How long a node waits for the others' answers.
pub const ASK_WAIT: Duration = Duration::from_secs(3);

/// The schema the fleet-wide tables are published in.
const SCHEMA: &str = "system_fleet";

/// One `clusterAllReplicas(…)` call in a statement's text.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    span: Range<usize>,
    cluster: String,
    table: String,
}

/// The text's tokens, as the lexer passes them.
#[derive(Default)]
struct Collected(Vec<(TokenKind, Range<usize>)>);

impl Tokens for Collected {
    fn token(&mut self, kind: TokenKind, span: Range<usize>) {
        self.0.push((kind, span));
    }
}

/// The `clusterAllReplicas` calls of `text` (none when it has none; an error for one whose
/// arguments are not a cluster and a system table).
fn calls(text: &str) -> Result<Vec<Call>> {
    let mut tokens = Collected::default();
    lex(text, &mut tokens);
    let tokens = tokens.0;
    let word = |t: &(TokenKind, Range<usize>)| &text[t.1.clone()];
    // A name: a word, a quoted identifier or a string (its quotes off).
    let name = |t: &(TokenKind, Range<usize>)| -> Option<String> {
        let s = word(t);
        match t.0 {
            TokenKind::Word => Some(s.to_string()),
            TokenKind::QuotedIdent | TokenKind::Literal
                if s.len() >= 2
                    && (s.starts_with('\'') || s.starts_with('"') || s.starts_with('`')) =>
            {
                Some(s[1..s.len() - 1].to_string())
            }
            _ => None,
        }
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        if !(t.0 == TokenKind::Word && word(t).eq_ignore_ascii_case("clusterAllReplicas")) {
            i += 1;
            continue;
        }
        let bad = || {
            Error::bad_arguments(
                "clusterAllReplicas takes a cluster and a system table: clusterAllReplicas('default', system.processes)",
            )
        };
        if tokens.get(i + 1).is_none_or(|t| word(t) != "(") {
            i += 1;
            continue;
        }
        // Up to the closing parenthesis: the arguments' tokens, split at commas.
        let mut args: Vec<Vec<&(TokenKind, Range<usize>)>> = vec![Vec::new()];
        let mut j = i + 2;
        let end = loop {
            let t = tokens.get(j).ok_or_else(bad)?;
            match word(t) {
                ")" => break t.1.end,
                "," => args.push(Vec::new()),
                "(" => return Err(bad()),
                _ => args.last_mut().expect("one at least").push(t),
            }
            j += 1;
        };
        let cluster = match args.first().map(Vec::as_slice) {
            Some([one]) => name(one).ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        let rest: Vec<&[&(TokenKind, Range<usize>)]> =
            args[1..].iter().map(Vec::as_slice).collect();
        let (database, table) = match rest.as_slice() {
            // system.X
            [[db, dot, table]] if word(dot) == "." => (name(db), name(table)),
            // 'system.X'
            [[both]] => match name(both).as_deref().and_then(|b| b.split_once('.')) {
                Some((db, table)) => (Some(db.to_string()), Some(table.to_string())),
                None => (None, None),
            },
            // 'system', 'X'
            [[db], [table]] => (name(db), name(table)),
            _ => (None, None),
        };
        let (Some(database), Some(table)) = (database, table) else {
            return Err(bad());
        };
        if !database.eq_ignore_ascii_case("system") {
            return Err(Error::new(
                ErrorCode::UnknownTable,
                format!(
                    "clusterAllReplicas reads sluice's system tables (system.processes, system.scheduler, …), not {database}.{table}"
                ),
            ));
        }
        out.push(Call {
            span: t.1.start..end,
            cluster,
            table: table.to_ascii_lowercase(),
        });
        i = j + 1;
    }
    Ok(out)
}

/// The names a `clusterAllReplicas` call may give this node's fleet: `default`, and the
/// fleet's prefix without its slashes (`/sluice` → `sluice`).
fn cluster_names(shared: &Shared) -> Vec<String> {
    let mut names = vec!["default".to_string()];
    if let Some(c) = &shared.options.cluster {
        let name = c.prefix.trim_matches('/').to_string();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}

/// `text` with its `clusterAllReplicas` calls replaced by the fleet-wide tables, filled now
/// (unchanged when it has none).
pub async fn prepare<'a>(shared: &Shared, text: &'a str) -> Result<Cow<'a, str>> {
    if !sluice_sql::mentions(text, "clusterallreplicas") {
        return Ok(Cow::Borrowed(text));
    }
    let calls = calls(text)?;
    if calls.is_empty() {
        return Ok(Cow::Borrowed(text));
    }
    let names = cluster_names(shared);
    let mut tables: Vec<&str> = Vec::new();
    for call in &calls {
        if !names.contains(&call.cluster) {
            return Err(Error::new(
                ErrorCode::ClusterDoesntExist,
                format!(
                    "Requested cluster '{}' not found: this node's fleet is {}",
                    call.cluster,
                    names
                        .iter()
                        .map(|n| format!("'{n}'"))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            ));
        }
        if !tables.contains(&call.table.as_str()) {
            tables.push(&call.table);
        }
    }
    let locals = local_tables(shared, &tables)?;
    for (table, local) in tables.into_iter().zip(locals) {
        let batch = gather(shared, table, local).await?;
        shared.engine.publish_table(SCHEMA, table, batch)?;
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for call in &calls {
        out.push_str(&text[at..call.span.start]);
        out.push_str(&format!("{SCHEMA}.\"{}\"", call.table));
        at = call.span.end;
    }
    out.push_str(&text[at..]);
    Ok(Cow::Owned(out))
}

/// This node's system tables `names`, as of now (built once for all of them).
fn local_tables(shared: &Shared, names: &[&str]) -> Result<Vec<RecordBatch>> {
    let mut found: Vec<Option<RecordBatch>> = vec![None; names.len()];
    crate::system::tables(shared, &mut |table, batch| {
        if let Some(i) = names.iter().position(|n| *n == table) {
            found[i] = Some(batch);
        }
        Ok(())
    })?;
    names
        .iter()
        .zip(found)
        .map(|(name, batch)| {
            batch.ok_or_else(|| {
                Error::new(
                    ErrorCode::UnknownTable,
                    format!("Table system.{name} does not exist (SELECT name FROM information_schema.tables WHERE table_schema = 'system' lists them)"),
                )
            })
        })
        .collect()
}

/// System table `name` of every live node of the fleet: this node's rows (`local`), then the
/// others'.
pub async fn gather(shared: &Shared, name: &str, local: RecordBatch) -> Result<RecordBatch> {
    let Some(fleet) = shared.fleet.get() else {
        return Ok(local);
    };
    let nodes: Vec<String> = fleet.nodes().into_iter().map(|n| n.name).collect();
    let answers = fleet
        .requests()
        .ask(fleet.lease(), "table", name.as_bytes(), &nodes, ASK_WAIT)
        .await?;
    let mut batches = vec![local];
    for (node, answer) in answers {
        let bytes = answer.map_err(|message| unanswered(&node, &message))?;
        let reader = sluice_engine::datafusion::arrow::ipc::reader::StreamReader::try_new(
            std::io::Cursor::new(bytes),
            None,
        )
        .map_err(|e| unanswered(&node, &e.to_string()))?;
        for batch in reader {
            batches.push(batch.map_err(|e| unanswered(&node, &e.to_string()))?);
        }
    }
    let schema = batches[0].schema();
    sluice_engine::datafusion::arrow::compute::concat_batches(&schema, &batches).map_err(|e| {
        Error::new(
            ErrorCode::AllConnectionTriesFailed,
            format!("the fleet's nodes answer system.{name} with different columns (a node of another version?): {e}"),
        )
    })
}

/// A node of the fleet that did not answer, or answered with an error.
fn unanswered(node: &str, message: &str) -> Error {
    Error::new(
        ErrorCode::AllConnectionTriesFailed,
        format!("node '{node}' of the fleet: {message} (system.nodes lists the live nodes)"),
    )
}

/// Asks `node` `what` with `body` and waits `wait` at most: its answer.
pub async fn ask_node(
    shared: &Shared,
    node: &str,
    what: &str,
    body: &str,
    wait: Duration,
) -> Result<String> {
    let Some(fleet) = shared.fleet.get() else {
        return Err(unanswered(node, "this node is not in a fleet"));
    };
    let answers = fleet
        .requests()
        .ask(
            fleet.lease(),
            what,
            body.as_bytes(),
            &[node.to_string()],
            wait,
        )
        .await?;
    match answers.into_iter().next() {
        Some((_, Ok(bytes))) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Some((_, Err(message))) => Err(unanswered(node, &message)),
        None => Err(unanswered(node, "no such node")),
    }
}

/// This node's system table `name` as an Arrow IPC stream: its answer to another node's
/// `table` request.
pub fn table_bytes(shared: &Shared, name: &str) -> Result<Vec<u8>> {
    let batch = local_tables(shared, &[name])?.remove(0);
    let ipc = |e: sluice_engine::datafusion::arrow::error::ArrowError| {
        Error::new(ErrorCode::InternalError, e.to_string())
    };
    let mut bytes = Vec::new();
    let mut writer = sluice_engine::datafusion::arrow::ipc::writer::StreamWriter::try_new(
        &mut bytes,
        &batch.schema(),
    )
    .map_err(ipc)?;
    writer.write(&batch).map_err(ipc)?;
    writer.finish().map_err(ipc)?;
    drop(writer);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_found_in_every_form_and_replaced() {
        let text = "SELECT * FROM clusterAllReplicas('default', system.processes) p JOIN clusterallreplicas(default, 'system', 'Scheduler') s ON true WHERE x = 'clusterAllReplicas(a, system.b)'";
        let found = calls(text).expect("parses");
        assert_eq!(
            found
                .iter()
                .map(|c| (c.cluster.as_str(), c.table.as_str(), &text[c.span.clone()]))
                .collect::<Vec<_>>(),
            vec![
                (
                    "default",
                    "processes",
                    "clusterAllReplicas('default', system.processes)"
                ),
                (
                    "default",
                    "scheduler",
                    "clusterallreplicas(default, 'system', 'Scheduler')"
                ),
            ]
        );
        assert!(calls("SELECT * FROM clusterAllReplicas('default')").is_err());
        assert!(calls("SELECT * FROM clusterAllReplicas('default', public.t)").is_err());
        assert!(calls("SELECT clusterAllReplicas FROM t")
            .expect("a column")
            .is_empty());
    }
}
