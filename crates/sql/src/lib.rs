//! # sluice-sql: the workload dialect
//!
//! Owns the text side of ClickHouse's workload DDL: tokenizing (sqlparser's tokenizer with
//! ClickHouse's lexical rules, [`parser::SluiceDialect`]), the statements ([`ast`]), taking the
//! `SETTINGS` tail off any query ([`parser::split_settings`]), and their
//! canonical text, which is exactly ClickHouse 26.9's normalized `create_query`; and the
//! statement model of everything clients send ([`statement`]: one lexing pass splits a text
//! into statements and says what each is, so the server routes on an enum), and statement
//! fingerprints, a statement with its values normalized away ([`fingerprint`]).
//! It also owns the error codes every layer reports ([`error`]).
//!
//! Layout, bottom up (a module imports only from those before it; no circle):
//! - [`error`]: codes, SQLSTATEs. [`lexer`]: one pass over a client's text, statement spans and
//!   tokens (PostgreSQL's lexical rules).
//! - [`ast`]: the dialect's statements and the classifiers' predicates, with their canonical
//!   `Display`.
//! - [`tags`]: SQLCommenter tags, read from the lexer's comments. [`parser`]: the dialect's
//!   text into [`ast`].
//! - [`statement`]: what a client sent, routed on one lexing pass (DDL through [`parser`]).
//!   [`fingerprint`]: a statement with its values normalized away.
//!
//! Invariants:
//! - Parsing never panics and does bounded work on any input ([`parser::MAX_INPUT_BYTES`]; the
//!   only nesting, a classifier's predicate, is bounded by [`parser::MAX_PREDICATE_DEPTH`]).
//! - For every statement `s`, `parse_statement(&s.to_string()) == Ok(s.normalized())`.
//! - A `CreateResource` from the parser has at least one operation, all of one [`CostUnit`].
//!
//! It knows nothing of the catalog or the network.

pub mod ast;
pub mod error;
pub mod fingerprint;
pub mod lexer;
pub mod parser;
pub mod statement;
pub mod tags;

pub use ast::{
    format_float, is_bare_identifier, Attribute, Comparison, CostUnit, CreateClassifier,
    CreateOptions, CreateResource, CreateWorkload, DiskRef, DropEntity, EntityKind, Literal,
    Predicate, QuotedIdent, ResourceOperation, SettingChange, Statement,
};
pub use error::{Error, ErrorCode, Position, Result};
pub use fingerprint::{fingerprint, fingerprint_key, Fingerprint};
pub use parser::{
    collapse_whitespace, first_chars, mention_places, mentions, parse_script, parse_statement,
    split_settings, QueryMarkup, ScriptStatement,
};
pub use statement::{
    integer_shape, only_statement, same_integer_shape, statement, statements, statements_with_text,
    CopyFormat, KillMode, Query, Statement as ClientStatement, StatementKind, TransactionControl,
    MAX_NESTING,
};
pub use tags::tags;
