//! A routed step as the bytes sent upstream ([`translate`]): in transaction pooling a
//! statement goes by its pooled name and is prepared first on a connection that lacks it; the
//! `SET`s that carry a grant to the upstream.

use super::*;

/// One step as bytes for the upstream, with what to do with its answer. In transaction
/// pooling, statements go by their pooled names and are prepared on this connection first
/// where it lacks them.
pub(super) fn translate(
    step: Step,
    lent: &mut Lent,
    pooled: bool,
    out: &mut BytesMut,
    answers: &mut VecDeque<Expect>,
    dirty: &mut bool,
) {
    // Prepares `prepared` under its pooled name on this connection unless it already is
    // (answered as `answer`); whether it was sent.
    let ensure = |prepared: &Prepared,
                  answer: Answer,
                  lent: &mut Lent,
                  out: &mut BytesMut,
                  answers: &mut VecDeque<Expect>| {
        let sent = lent.prepared.insert(prepared.pooled_name.clone());
        if sent {
            prepared.encode_parse(&prepared.pooled_name, out);
            answers.push_back(Expect {
                answer,
                prepares: Some(prepared.pooled_name.clone()),
            });
        }
        sent
    };
    match step {
        Step::Parse { name, prepared } => {
            *dirty |= prepared.forwarded.changes_session;
            if pooled && !name.is_empty() {
                if !ensure(&prepared, Answer::Relay(Ends::One), lent, out, answers) {
                    answers.push_back(Expect::new(Answer::Synthetic(messages::PARSE_COMPLETE)));
                }
            } else {
                prepared.encode_parse(&name, out);
                answers.push_back(Expect::relay(Ends::One));
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
                    ensure(p, Answer::Prepare, lent, out, answers);
                    renamed_bind(&frame, statement, &p.pooled_name, out);
                }
                _ => out.extend_from_slice(&frame),
            }
            answers.push_back(Expect::relay(Ends::One));
        }
        Step::DescribeStatement { name, prepared } => {
            let target = match (pooled, &prepared) {
                (true, Some(p)) if !name.is_empty() => {
                    ensure(p, Answer::Prepare, lent, out, answers);
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
