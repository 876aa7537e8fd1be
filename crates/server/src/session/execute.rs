//! The extended protocol's Execute: pgwire's `_on_execute`, with a portal's rows sent as they
//! come. pgwire gathers every row a fetch may send into one vector first — a whole answer held
//! in memory when there is no row limit (5 million rows of a `SELECT` took the server's RSS
//! from 82 MB to 852 MB, where the simple protocol streams them in 88) — and makes room for
//! the limit's count up front (a negative limit, which PostgreSQL reads as none, panicked the
//! connection's thread). Everything else is as pgwire does it: the statement runs on the first
//! Execute of a portal (`do_query`, cancellable), later ones go on where it stopped, a limit
//! reached is `PortalSuspended`, the end is `CommandComplete` with the rows sent.

use std::fmt::Debug;
use std::sync::Arc;

use futures::future::{select, Either};
use futures::{Sink, SinkExt, StreamExt};
use pgwire::api::copy::{send_copy_both_response, send_copy_in_response, send_copy_out_response};
use pgwire::api::portal::PortalExecutionState;
use pgwire::api::query::{send_execution_response, ExtendedQueryHandler};
use pgwire::api::results::{QueryResponse, Response};
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionHandle, PgWireConnectionState, DEFAULT_NAME,
};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::data::RowDescription;
use pgwire::messages::extendedquery::{Execute, PortalSuspended};
use pgwire::messages::response::{CommandComplete, EmptyQueryResponse};
use pgwire::messages::PgWireBackendMessage;

/// Answers one Execute for `handler` (see the module docs).
pub(super) async fn execute<H, C>(
    handler: &H,
    client: &mut C,
    message: Execute,
    cancel_handle: Option<&Arc<ConnectionHandle>>,
) -> PgWireResult<()>
where
    H: ExtendedQueryHandler + ?Sized,
    C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::PortalStore: PortalStore<Statement = H::Statement>,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
        return Err(PgWireError::NotReadyForQuery);
    }
    let mut transaction_status = client.transaction_status();
    client.set_state(PgWireConnectionState::QueryInProgress);
    let portal_name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
    // Zero or less: no limit.
    let max_rows = usize::try_from(message.max_rows).unwrap_or(0);
    let portal = match client.portal_store().get_portal(portal_name) {
        Some(Entry::Value(portal)) => portal,
        Some(Entry::Empty) => {
            client
                .feed(PgWireBackendMessage::EmptyQueryResponse(
                    EmptyQueryResponse::new(),
                ))
                .await?;
            client.set_state(PgWireConnectionState::ReadyForQuery);
            return Ok(());
        }
        None => return Err(PgWireError::PortalNotFound(portal_name.to_owned())),
    };
    // Held from here to the last row sent: one lock per Execute (the statement's own run
    // never looks at it).
    let state = portal.state();
    let mut state = state.lock().await;
    let has_rows = if matches!(*state, PortalExecutionState::Initial) {
        let cancel = match cancel_handle {
            Some(handle) => Some(handle.start_query().await),
            None => None,
        };
        let response = match cancel {
            Some(cancel) => match select(handler.do_query(client, &portal, max_rows), cancel).await
            {
                Either::Left((result, _)) => result,
                Either::Right(_) => Err(PgWireError::QueryCanceled),
            },
            None => handler.do_query(client, &portal, max_rows).await,
        }?;
        match response {
            Response::Query(rows) => {
                *state = PortalExecutionState::Suspended(rows);
                true
            }
            Response::EmptyQuery => {
                client
                    .feed(PgWireBackendMessage::EmptyQueryResponse(
                        EmptyQueryResponse::new(),
                    ))
                    .await?;
                false
            }
            Response::Execution(tag) => {
                send_execution_response(client, tag).await?;
                false
            }
            Response::TransactionStart(tag) => {
                send_execution_response(client, tag).await?;
                transaction_status = transaction_status.to_in_transaction_state();
                false
            }
            Response::TransactionEnd(tag) => {
                send_execution_response(client, tag).await?;
                transaction_status = transaction_status.to_idle_state();
                // The unnamed portal goes with its transaction.
                client.portal_store().rm_portal(DEFAULT_NAME);
                false
            }
            Response::Error(e) => {
                client
                    .send(PgWireBackendMessage::ErrorResponse((*e).into()))
                    .await?;
                transaction_status = transaction_status.to_error_state();
                false
            }
            Response::CopyIn(copy) => {
                client.set_state(PgWireConnectionState::CopyInProgress(true));
                send_copy_in_response(client, copy).await?;
                false
            }
            Response::CopyOut(copy) => {
                send_copy_out_response(client, copy).await?;
                false
            }
            Response::CopyBoth(copy) => {
                client.set_state(PgWireConnectionState::CopyInProgress(true));
                send_copy_both_response(client, copy).await?;
                false
            }
        }
    } else {
        // Suspended (or finished): go on where the last Execute stopped.
        true
    };
    if has_rows {
        send_rows(client, &mut state, max_rows).await?;
    }
    if !matches!(client.state(), PgWireConnectionState::CopyInProgress(_)) {
        client.set_state(PgWireConnectionState::ReadyForQuery);
        client.set_transaction_status(transaction_status);
    }
    Ok(())
}

/// Sends a started portal's next rows, at most `max_rows` (0: all), one by one as its stream
/// yields them; then `PortalSuspended` if the limit was reached (the rest stays in the
/// portal for the next Execute), else `CommandComplete` with the count sent.
async fn send_rows<C>(
    client: &mut C,
    state: &mut PortalExecutionState,
    max_rows: usize,
) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let mut response = match std::mem::replace(state, PortalExecutionState::Finished) {
        PortalExecutionState::Suspended(response) => response,
        // Run to its end already: nothing more, as PostgreSQL answers.
        PortalExecutionState::Finished => {
            QueryResponse::new(Arc::new(Vec::new()), futures::stream::empty())
        }
        PortalExecutionState::Initial => {
            *state = PortalExecutionState::Initial;
            return Err(PgWireError::PortalNotStarted);
        }
    };
    let mut sent = 0;
    while max_rows == 0 || sent < max_rows {
        match response.data_rows().next().await {
            // An error ends the portal (its state stays finished).
            Some(row) => {
                client.feed(PgWireBackendMessage::DataRow(row?)).await?;
                sent += 1;
            }
            // Fed, not flushed: the Sync or Flush that ends the client's batch sends it.
            None => {
                return Ok(client
                    .feed(PgWireBackendMessage::CommandComplete(CommandComplete::new(
                        counted_tag(response.command_tag(), sent),
                    )))
                    .await?);
            }
        }
    }
    *state = PortalExecutionState::Suspended(response);
    Ok(client
        .feed(PgWireBackendMessage::PortalSuspended(PortalSuspended::new()))
        .await?)
}

/// A simple Query's result: its RowDescription, its rows as they come, CommandComplete with
/// their count — as pgwire's `send_query_response`, with the tag written by [`counted_tag`].
pub(super) async fn send_query_rows<C>(
    client: &mut C,
    mut response: QueryResponse,
) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let fields = response.row_schema().iter().map(Into::into).collect();
    client
        .feed(PgWireBackendMessage::RowDescription(RowDescription::new(
            fields,
        )))
        .await?;
    let mut sent = 0;
    while let Some(row) = response.data_rows().next().await {
        client.feed(PgWireBackendMessage::DataRow(row?)).await?;
        sent += 1;
    }
    Ok(client
        .feed(PgWireBackendMessage::CommandComplete(CommandComplete::new(
            counted_tag(response.command_tag(), sent),
        )))
        .await?)
}

/// `tag` and the rows it counts, as a CommandComplete says it (`SELECT 3`): pgwire's `Tag`
/// says the same with two allocations and a `format!` (~700 instructions a statement).
fn counted_tag(tag: &str, rows: usize) -> String {
    // The digits by hand: `write!` costs more than the rest of the tag.
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = rows;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut out = String::with_capacity(tag.len() + 1 + digits.len() - at);
    out.push_str(tag);
    out.push(' ');
    out.extend(digits[at..].iter().map(|&d| d as char));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_counted_tag_reads_as_pgwires() {
        for (tag, rows) in [
            ("SELECT", 0),
            ("SELECT", 1),
            ("SELECT", 10),
            ("FETCH", 123_456_789),
            ("INSERT 0", usize::MAX),
        ] {
            let theirs: pgwire::messages::response::CommandComplete =
                pgwire::api::results::Tag::new(tag).with_rows(rows).into();
            assert_eq!(super::counted_tag(tag, rows), theirs.tag);
        }
    }
}
