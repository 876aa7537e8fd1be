//! The upstream's side of upstream mode, below the forwarding of messages
//! ([`crate::forward`]): its options, and its pools of connections with what a client's
//! start-up asks of them. The server's shared state holds an [`Upstream`]; nothing here knows
//! a client's conversation.

pub mod options;
pub mod pools;

pub use options::{
    AdmissionMode, PoolMode, UpstreamOptions, UpstreamUrl, DEFAULT_AUTH_QUERY,
    DEFAULT_MAX_PREPARED_STATEMENTS, DEFAULT_SERVER_IDLE_TIMEOUT,
};
pub(crate) use pools::follow_parameter;
pub use pools::{client_parameters, close_idle_connections, fatal_from, SessionBackend, Upstream};
