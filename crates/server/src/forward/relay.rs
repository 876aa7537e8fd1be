//! The upstream's answers to what was sent, relayed to the client ([`Forwarder::relay`]):
//! matched to what was sent (each [`Expect`]), rows and completions passed in place, errors and
//! FATALs handled as PostgreSQL's client would see them, the statement's stop looked at while
//! the answer comes; COPY FROM STDIN's data passed up; a lost upstream connection ends the
//! statement (08006).

use super::*;

impl Forwarder {
    /// Sends `out` and passes the answers on, as `answers` says. `settle`: a ReadyForQuery
    /// read ends the statement's admission (see [`Forwarder::settled`]).
    pub(super) async fn relay<S, T>(
        &mut self,
        socket: &mut Socket<S, T>,
        mut out: BytesMut,
        mut answers: VecDeque<Expect>,
        settle: bool,
    ) -> ClientResult<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        // What pgwire wrote (notices of the admission) goes first.
        SinkExt::<PgWireBackendMessage>::flush(socket).await?;
        self.last_failed = false;
        let Some(lent) = self.lent.as_mut() else {
            return Ok(());
        };
        let readies = answers
            .iter()
            .filter(|a| a.answer.ends() == Ends::Ready)
            .count();
        lent.awaiting += readies;
        let sent = lent.send(&out).await;
        // Kept for the next batch, unless a large one (a big Bind) would stay with the
        // connection for the rest of its life.
        if out.capacity() > self.spare_out.capacity() && out.capacity() <= KEEP_AT_MOST {
            out.clear();
            self.spare_out = out;
        }
        if let Err(e) = sent {
            return self.lost(socket, e, readies > 0).await;
        }
        let mut got_ready = false;
        // Reads since the stop was last looked at while the upstream kept data coming.
        let mut reads_unchecked = 0usize;
        loop {
            while let Some(Expect {
                answer: Answer::Synthetic(tag),
                ..
            }) = answers.front()
            {
                write_raw(socket, &messages::bodiless(*tag)).await?;
                answers.pop_front();
            }
            // What the answer at the head is (copied: the rest of its `Expect` is read only
            // on an error).
            let Some(head) = answers.front().map(|e| e.answer) else {
                break;
            };
            let lent = self.lent.as_mut().expect("lent while relaying");
            // What only passes to the client, already read, goes on in place: its bytes are
            // copied once, with no frame taken apart and no future (most of an answer).
            if let Some(message) = lent.peek_message().filter(|m| passes_in_place(m[0])) {
                let tag = message[0];
                // Every prepared statement of the session dropped (transaction pooling: the
                // client's names and what this connection holds of sluice's are forgotten,
                // as PostgreSQL forgets them).
                let drops_prepared = tag == b'C'
                    && message.get(5) == Some(&b'D')
                    && self.upstream.options.pool_mode == PoolMode::Transaction
                    && drops_prepared(&message[5..]);
                let shown = if tag == b'Z' {
                    // A sluice message of this batch that failed left pgwire waiting for the
                    // Sync; the upstream's ReadyForQuery answers that Sync.
                    if matches!(
                        socket.state(),
                        pgwire::api::PgWireConnectionState::AwaitingSync
                    ) {
                        socket.set_state(pgwire::api::PgWireConnectionState::ReadyForQuery);
                    }
                    self.status =
                        messages::transaction_status(message.get(5).copied().unwrap_or(b'I'));
                    socket.set_transaction_status(self.status);
                    matches!(head, Answer::Relay(_))
                } else {
                    if tag == b'C' {
                        if let Some(record) = self.record.as_mut() {
                            record.add_rows(rows_counted(&message[5..]));
                        }
                    }
                    head.shown()
                };
                if shown {
                    write_message(socket, message).await?;
                }
                let len = message.len();
                lent.pass(len);
                if drops_prepared {
                    lent.prepared.clear();
                    self.statements.clear();
                }
                if tag == b'Z' {
                    answers.pop_front();
                    got_ready = true;
                } else if head.ends().by(tag) {
                    answers.pop_front();
                }
                continue;
            }
            let stop = self
                .running
                .as_mut()
                .filter(|r| r.stopped.is_none())
                .map(|r| &mut r.admitted.stop);
            let frame = match (lent.buffered_frame(), stop) {
                // The answer first: a frame already read never waits for the stop's checks
                // (nor costs a future).
                (Some(frame), _) => frame,
                // More is read, then taken in place where it can be.
                (None, Some(stop)) => {
                    // The read first (the answer is what is waited for), but while the
                    // upstream keeps data coming (a long COPY OUT, a big result) the read is
                    // always ready: the stop is looked at every few reads too.
                    reads_unchecked += 1;
                    let stopped = if reads_unchecked >= READS_PER_STOP_CHECK {
                        reads_unchecked = 0;
                        futures::FutureExt::now_or_never(&mut *stop)
                    } else {
                        None
                    };
                    let stopped = match stopped {
                        Some(e) => e,
                        None => tokio::select! {
                            biased;
                            more = lent.read_more() => match more {
                                Ok(()) => continue,
                                Err(e) => return self.lost(socket, e, readies > 0).await,
                            },
                            e = stop => e,
                        },
                    };
                    // Cancelled, killed, out of time, or its client went away: the upstream
                    // is asked to stop, and its answer is still read out.
                    if let Some(token) = lent.cancel_token() {
                        let _ = token.cancel().await;
                    }
                    if let Some(running) = self.running.as_mut() {
                        running.stopped = Some(stopped);
                    }
                    continue;
                }
                (None, None) => {
                    // Asked to stop: the answer is waited for a while, not for ever. An
                    // upstream that ignores the cancel (one skipping to a Sync that never
                    // comes, one that hangs) would keep the statement's slot held for good.
                    let waited = match self.running.as_ref().and_then(|r| r.stopped.as_ref()) {
                        Some(_) => tokio::time::timeout(STOP_GRACE, lent.read_more()).await,
                        None => Ok(lent.read_more().await),
                    };
                    match waited {
                        Ok(Ok(())) => continue,
                        Ok(Err(e)) => Err(e),
                        Err(_) => {
                            let stopped = self
                                .running
                                .as_ref()
                                .and_then(|r| r.stopped.clone())
                                .map_or_else(String::new, |e| format!("{}: ", e.message));
                            let e = Error::new(
                                sluice_sql::ErrorCode::AllConnectionTriesFailed,
                                format!(
                                    "{stopped}the upstream did not answer within {} s of being asked to stop; its connection was closed",
                                    STOP_GRACE.as_secs()
                                ),
                            );
                            return self.lost(socket, e, readies > 0).await;
                        }
                    }
                }
            };
            let frame = match frame {
                Ok(frame) => frame,
                Err(e) => return self.lost(socket, e, readies > 0).await,
            };
            match frame.tag {
                // Asynchronous: a notice, a notification, a parameter's new value.
                b'N' | b'A' => {
                    write_frame(socket, &frame).await?;
                    socket.get_mut().flush().await?;
                    continue;
                }
                b'S' => {
                    lent.dirty = true;
                    if let Some(wanted) = self.wanted.as_mut() {
                        follow_parameter(wanted, &frame);
                    }
                    write_frame(socket, &frame).await?;
                    continue;
                }
                b'E' if is_fatal(&frame) => {
                    // The upstream ends the session: so does the client's connection, after
                    // PostgreSQL's message, as going direct.
                    if let Some(running) = self.running.as_mut() {
                        running.failed = true;
                        if let Some(record) = self.record.as_mut() {
                            record.failed_upstream(&sqlstate(&frame));
                        }
                    }
                    self.end_running(None);
                    if let Some(lent) = self.lent.take() {
                        lent.discard();
                    }
                    write_frame(socket, &frame).await?;
                    socket.get_mut().flush().await?;
                    return Err(session_ended());
                }
                b'E' if head == Answer::Quiet => {
                    // sluice's own SETs failed (the upstream is no PostgreSQL, a start-up
                    // option it does not know): the client hears of it, its statement runs.
                    let notice = Frame {
                        tag: b'N',
                        body: frame.body.clone(),
                    };
                    write_frame(socket, &notice).await?;
                    continue;
                }
                b'E' => {
                    self.last_failed = true;
                    if let Some(running) = self.running.as_mut() {
                        running.failed = true;
                        if let Some(record) = self.record.as_mut() {
                            record.failed_upstream(&sqlstate(&frame));
                        }
                    }
                    let stopped = self.running.as_ref().and_then(|r| r.stopped.as_ref());
                    let shows = answers.front().and_then(|e| e.shows.as_ref());
                    match (stopped, shows) {
                        (Some(e), _) if sqlstate(&frame) == "57014" => {
                            write_raw(socket, &error_bytes(e)).await?;
                        }
                        (_, Some((pooled, client))) => {
                            write_frame(socket, &naming_client(&frame, pooled, client)).await?
                        }
                        _ => write_frame(socket, &frame).await?,
                    }
                    if head.ends() == Ends::Ready {
                        continue; // a simple Query's error: its ReadyForQuery follows
                    }
                    // The upstream skips the rest up to Sync: what those messages would have
                    // done to the connection's statements is undone, the last first (a
                    // statement closed and then prepared again there is still prepared).
                    let lent = self.lent.as_mut().expect("lent while relaying");
                    let skipped = answers
                        .iter()
                        .take_while(|a| !matches!(a.answer, Answer::Relay(Ends::Ready)))
                        .count();
                    for a in answers.range(..skipped).rev() {
                        if let Some(name) = &a.prepares {
                            lent.prepared.remove(name);
                        }
                        if let Some(name) = &a.closes {
                            lent.prepared.keep(name.clone());
                        }
                    }
                    for a in answers.drain(..skipped) {
                        if let Some(name) = &a.defines {
                            self.statements.remove(name);
                        }
                    }
                    if answers.is_empty() {
                        self.failed = Failed::Upstream;
                    }
                    continue;
                }
                b'G' => {
                    write_frame(socket, &frame).await?;
                    socket.get_mut().flush().await?;
                    let extended = head != Answer::Relay(Ends::Ready) && head != Answer::Piece;
                    self.copy_in(socket, extended).await?;
                    continue;
                }
                // Only what `passes_in_place` leaves comes here (the start-up's 'K' and 'R'
                // besides those above): rows, completions and ReadyForQuery never do.
                tag => {
                    if head.shown() {
                        write_frame(socket, &frame).await?;
                    }
                    if head.ends().by(tag) {
                        answers.pop_front();
                    }
                }
            }
        }
        if answers.capacity() > self.spare_answers.capacity() {
            self.spare_answers = answers;
        }
        if got_ready && settle {
            self.settled();
        }
        if self.hold_answers && !self.last_failed {
            return Ok(());
        }
        socket.get_mut().flush().await
    }

    /// COPY FROM STDIN: the client's data goes upstream as it comes, up to CopyDone or
    /// CopyFail (and, in the extended protocol, the Sync after it).
    pub(super) async fn copy_in<S, T>(
        &mut self,
        socket: &mut Socket<S, T>,
        extended: bool,
    ) -> ClientResult<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        let mut out = BytesMut::new();
        let mut done = false;
        loop {
            // Every message whole: CopyData goes upstream as it came.
            let Some(Ok(Incoming::Raw(frame))) = next_incoming(socket, |_| true).await else {
                // The client went away mid-COPY: the upstream is told to abandon it (so the
                // table is as it was), and the connection is reset when it goes back.
                let mut fail = BytesMut::new();
                encode(
                    &pgwire::messages::copy::CopyFail::new("the client went away".into()),
                    &mut fail,
                );
                if let Some(lent) = self.lent.as_mut() {
                    let _ = lent.send(&fail).await;
                }
                return Err(std::io::ErrorKind::ConnectionAborted.into());
            };
            let last = match frame[0] {
                // CopyDone, CopyFail; in the extended protocol the Sync after them.
                b'c' | b'f' => {
                    done = true;
                    !extended
                }
                b'S' => done,
                _ => false,
            };
            out.extend_from_slice(&frame);
            if last || out.len() >= 64 * 1024 {
                let lent = self.lent.as_mut().expect("lent while copying");
                if let Err(e) = lent.send(&out).await {
                    // Read on: the relay notices the loss and answers the client.
                    tracing::debug!("upstream lost during COPY: {e}");
                    return Ok(());
                }
                out.clear();
            }
            if last {
                return Ok(());
            }
        }
    }

    /// The upstream connection was lost: the client is told (08006, naming the upstream), and
    /// the connection is closed, never lent again; what the statement held is let go.
    pub(super) async fn lost<S, T>(
        &mut self,
        socket: &mut Socket<S, T>,
        e: Error,
        ready: bool,
    ) -> ClientResult<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        if let Some(lent) = self.lent.take() {
            lent.discard();
        }
        self.last_failed = true;
        self.failed = Failed::No;
        self.in_batch = false;
        self.status = TransactionStatus::Idle;
        socket.set_transaction_status(TransactionStatus::Idle);
        self.end_running(Some(&e));
        write_raw(socket, &error_bytes(&e)).await?;
        if ready {
            write_raw(socket, &messages::ready_for_query(TransactionStatus::Idle)).await?;
        }
        socket.get_mut().flush().await
    }
}
