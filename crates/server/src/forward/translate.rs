//! A routed step as the bytes sent upstream ([`translate`]): in transaction pooling a
//! statement goes by its pooled name and is prepared first on a connection that lacks it; the
//! `SET`s that carry a grant to the upstream.

use super::*;

/// One step as bytes for the upstream, with what to do with its answer. In transaction
/// pooling (`pooled`: the most statements a connection keeps prepared), statements go by
/// their pooled names and are prepared on this connection first where it lacks them.
pub(super) fn translate(
    step: Step,
    lent: &mut Lent,
    pooled: Option<usize>,
    out: &mut BytesMut,
    answers: &mut VecDeque<Expect>,
    dirty: &mut bool,
) {
    let max_prepared = pooled.unwrap_or(usize::MAX);
    let pooled = pooled.is_some();
    // Prepares `prepared` under its pooled name on this connection unless it already is
    // (answered as `answer`), closing first the statement used longest ago if the connection
    // holds as many as it may; whether it was sent.
    let ensure = |prepared: &Prepared,
                  answer: Answer,
                  lent: &mut Lent,
                  out: &mut BytesMut,
                  answers: &mut VecDeque<Expect>| {
        let (sent, evicted) = lent.prepared.use_name(&prepared.pooled_name, max_prepared);
        if let Some(evicted) = evicted {
            encode(
                &Close::new(TARGET_TYPE_BYTE_STATEMENT, Some(evicted.clone())),
                out,
            );
            answers.push_back(Expect {
                closes: Some(evicted),
                ..Expect::new(Answer::Own)
            });
        }
        if sent {
            prepared.encode_parse(&prepared.pooled_name, out);
            answers.push_back(Expect {
                prepares: Some(prepared.pooled_name.clone()),
                ..Expect::new(answer)
            });
        }
        sent
    };
    match step {
        Step::Parse {
            name,
            prepared,
            existing: Some(existing),
        } => {
            // PostgreSQL parses the text, then refuses the name in use (42P05), and skips
            // to Sync: the text goes under the pooled name of the statement that holds the
            // client's name, on a connection made to hold it, so the upstream answers (and
            // skips) as it would answer the client; its error shows the client's name.
            ensure(&existing, Answer::Own, lent, out, answers);
            prepared.encode_parse(&existing.pooled_name, out);
            answers.push_back(Expect {
                shows: Some((existing.pooled_name.clone(), name)),
                ..Expect::relay(Ends::One)
            });
        }
        Step::Parse { name, prepared, .. } => {
            *dirty |= prepared.forwarded.changes_session;
            if pooled && !name.is_empty() {
                if !ensure(&prepared, Answer::Relay(Ends::One), lent, out, answers) {
                    answers.push_back(Expect::new(Answer::Synthetic(messages::PARSE_COMPLETE)));
                } else if let Some(sent) = answers.back_mut() {
                    sent.defines = Some(name);
                }
            } else {
                prepared.encode_parse(&name, out);
                answers.push_back(Expect {
                    defines: Some(name),
                    ..Expect::relay(Ends::One)
                });
            }
        }
        Step::Bind {
            frame,
            statement,
            prepared,
        } => {
            if let Some(p) = &prepared {
                *dirty |= p.forwarded.changes_session;
            }
            match &prepared {
                Some(p) if pooled && !statement.is_empty() => {
                    ensure(p, Answer::Own, lent, out, answers);
                    renamed_bind(&frame, statement, &p.pooled_name, out);
                }
                _ => out.extend_from_slice(&frame),
            }
            answers.push_back(Expect::relay(Ends::One));
        }
        Step::DescribeStatement { name, prepared } => {
            let target = match (pooled, &prepared) {
                (true, Some(p)) if !name.is_empty() => {
                    ensure(p, Answer::Own, lent, out, answers);
                    p.pooled_name.clone()
                }
                _ => name,
            };
            encode(
                &Describe::new(TARGET_TYPE_BYTE_STATEMENT, Some(target)),
                out,
            );
            answers.push_back(Expect::relay(Ends::Description));
        }
        Step::Execute { frame, .. } => {
            out.extend_from_slice(&frame);
            answers.push_back(Expect::relay(Ends::Execution));
        }
        Step::Portal(message, ends) => {
            let _ = message.encode(out);
            answers.push_back(Expect::relay(ends));
        }
        Step::Passed { frame, ends } => {
            out.extend_from_slice(&frame);
            answers.push_back(Expect::relay(ends));
        }
        Step::CloseStatement { name } => {
            if pooled && !name.is_empty() {
                // Pooled statements are shared: the client's name is forgotten, the
                // statement stays.
                answers.push_back(Expect::new(Answer::Synthetic(messages::CLOSE_COMPLETE)));
            } else {
                encode(&Close::new(TARGET_TYPE_BYTE_STATEMENT, Some(name)), out);
                answers.push_back(Expect::relay(Ends::One));
            }
        }
        Step::Deallocate { .. } | Step::Query { .. } | Step::Sync | Step::Flush => {}
    }
}

/// The `SET`s that carry a statement's grant to the upstream: its CPU threads as parallel
/// workers (the master's thread is the leader's), its memory reservation as `work_mem`.
/// Empty when the grant carries neither; otherwise both, each set or reset, so nothing of
/// one statement's grant stays for the next.
pub(super) fn upstream_settings(admitted: &Admitted) -> String {
    if admitted.threads.is_none() && admitted.reserve_memory == 0 {
        return String::new();
    }
    let workers = match admitted.threads {
        Some(threads) => format!(
            "SET max_parallel_workers_per_gather = {}",
            threads.saturating_sub(1)
        ),
        None => RESET_WORKERS.to_string(),
    };
    let memory = match admitted.reserve_memory {
        0 => RESET_MEMORY.to_string(),
        bytes => format!("SET work_mem = '{}kB'", (bytes / 1024).max(64)),
    };
    format!("{workers}; {memory}")
}

pub(super) const RESET_WORKERS: &str = "RESET max_parallel_workers_per_gather";
pub(super) const RESET_MEMORY: &str = "RESET work_mem";

/// An upstream ErrorResponse naming pooled statement `pooled`, as the client sees it: its
/// message names the client's statement `client` instead.
pub(super) fn naming_client(error: &Frame, pooled: &str, client: &str) -> Frame {
    use bytes::BufMut;
    let quoted = format!("\"{pooled}\"");
    let shown = format!("\"{client}\"");
    let mut body = BytesMut::with_capacity(error.body.len() + client.len());
    for field in error.body.split(|&b| b == 0) {
        if field.is_empty() {
            break; // the terminator
        }
        match field.split_first() {
            Some((b'M', text)) => {
                body.put_u8(b'M');
                let text = String::from_utf8_lossy(text).replacen(&quoted, &shown, 1);
                body.extend_from_slice(text.as_bytes());
            }
            _ => body.extend_from_slice(field),
        }
        body.put_u8(0);
    }
    body.put_u8(0);
    Frame {
        tag: error.tag,
        body: body.freeze(),
    }
}
