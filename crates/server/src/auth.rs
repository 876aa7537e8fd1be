//! Who may connect and what they may do: `[[users]]` with SCRAM-SHA-256 verifiers (and, in
//! upstream mode with `auth_query`, the upstream's roles with theirs), the trust mode for
//! loopback when there are neither, TLS, and each user's workload rules. A SCRAM login also
//! yields the role's keys ([`ScramKeys`]), which upstream mode logs in with as the client's
//! role.
//!
//! Invariants:
//! - No password is ever stored or logged: a user carries a Postgres-format SCRAM verifier
//!   (`SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`), which proves a password
//!   without revealing it (`sluice passwd` makes one).
//! - With no users, every client is trusted — so the server refuses to listen beyond loopback
//!   (checked where the listener is chosen, see [`check_listen`]).

use std::collections::HashMap;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use futures::{Sink, SinkExt};
use pgwire::api::auth::driver::{AuthDriver, AuthOutcome};
use pgwire::api::auth::mechanism::{AuthMechanism, AuthState};
use pgwire::api::auth::sasl::scram::{
    gen_salted_password, ScramSecret, ScramServerAuth, ScramServerAuthWaitingForClientFinal,
};
use pgwire::api::auth::sasl::{SCRAM_SHA_256_METHOD, SCRAM_SHA_256_PLUS_METHOD};
use pgwire::api::auth::{
    protocol_negotiation, save_startup_parameters_to_metadata, DefaultServerParameterProvider,
    StartupHandler,
};
use pgwire::api::{ClientInfo, METADATA_USER};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::startup::{Authentication, PasswordMessageFamily, SASLInitialResponse};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use sluice_engine::upstream::ScramKeys;
use sluice_sql::{Error, ErrorCode, Result};

/// The iteration count of verifiers `sluice passwd` makes (Postgres' default).
pub const SCRAM_ITERATIONS: usize = 4096;

/// One `[[users]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct User {
    pub name: String,
    /// The SCRAM-SHA-256 verifier, in Postgres' `pg_authid.rolpassword` format.
    pub scram: String,
    /// May run workload DDL (`CREATE|DROP WORKLOAD|RESOURCE`).
    pub admin: bool,
    /// The workload of this user's queries when they name none.
    pub default_workload: Option<String>,
    /// The only workload this user's queries may run in; naming another is
    /// SETTING_CONSTRAINT_VIOLATION.
    pub pinned_workload: Option<String>,
    /// The hard limit of this user's queries when the query sets none (before the workload's).
    pub max_execution_time: Option<std::time::Duration>,
    /// How long this user's queries may wait for admission when neither the query nor the
    /// session says (`workload_admission_timeout_ms`).
    pub admission_timeout: Option<std::time::Duration>,
}

/// A parsed verifier.
#[derive(Clone, PartialEq)]
struct Verifier {
    iterations: usize,
    salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

fn parse_verifier(text: &str) -> std::result::Result<Verifier, String> {
    let bad = || {
        "expected SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey> (make one with `sluice passwd`)".to_string()
    };
    let rest = text.strip_prefix("SCRAM-SHA-256$").ok_or_else(bad)?;
    let (params, keys) = rest.split_once('$').ok_or_else(bad)?;
    let (iterations, salt) = params.split_once(':').ok_or_else(bad)?;
    let (stored_key, server_key) = keys.split_once(':').ok_or_else(bad)?;
    let decode = |s: &str| STANDARD.decode(s).map_err(|e| format!("{}: {e}", bad()));
    let v = Verifier {
        iterations: iterations.parse().map_err(|_| bad())?,
        salt: decode(salt)?,
        stored_key: decode(stored_key)?,
        server_key: decode(server_key)?,
    };
    if v.iterations == 0 || v.stored_key.len() != 32 || v.server_key.len() != 32 {
        return Err(bad());
    }
    Ok(v)
}

/// A new SCRAM-SHA-256 verifier for `password`, with a random 16-byte salt.
pub fn make_verifier(password: &str) -> Result<String> {
    use ring::rand::SecureRandom;
    let mut salt = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut salt)
        .map_err(|_| Error::new(ErrorCode::InternalError, "no randomness for a salt"))?;
    let salted = gen_salted_password(password, &salt, SCRAM_ITERATIONS);
    let ScramSecret::Verifier {
        stored_key,
        server_key,
        ..
    } = ScramSecret::verifier_from_salted_password(salt.to_vec(), salted, SCRAM_ITERATIONS)
    else {
        unreachable!("verifier_from_salted_password returns a verifier")
    };
    Ok(format!(
        "SCRAM-SHA-256${SCRAM_ITERATIONS}:{}${}:{}",
        STANDARD.encode(salt),
        STANDARD.encode(stored_key),
        STANDARD.encode(server_key)
    ))
}

/// The configured users, checked.
#[derive(Debug, Default)]
pub struct Users {
    by_name: HashMap<String, (User, Verifier)>,
}

impl Users {
    /// Checks every entry: names unique, verifiers well formed, not both a default and a
    /// pinned workload.
    pub fn new(users: Vec<User>) -> Result<Users> {
        let mut by_name = HashMap::new();
        for user in users {
            let invalid = |why: String| {
                Error::new(
                    ErrorCode::BadArguments,
                    format!("[[users]] '{}': {why}", user.name),
                )
            };
            if user.name.is_empty() {
                return Err(Error::new(
                    ErrorCode::BadArguments,
                    "[[users]]: an entry has an empty name",
                ));
            }
            let verifier =
                parse_verifier(&user.scram).map_err(|e| invalid(format!("scram: {e}")))?;
            if user.default_workload.is_some() && user.pinned_workload.is_some() {
                return Err(invalid(
                    "set default_workload or pinned_workload, not both (a pinned workload is also the default)".into(),
                ));
            }
            if by_name.contains_key(&user.name) {
                return Err(invalid("configured twice".into()));
            }
            by_name.insert(user.name.clone(), (user, verifier));
        }
        Ok(Users { by_name })
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Whether `password` is `name`'s (checked against the stored SCRAM verifier, as the SQL
    /// port's SCRAM exchange would): for HTTP Basic authentication of the live page.
    pub fn check_password(&self, name: &str, password: &str) -> bool {
        let Some((_, v)) = self.by_name.get(name) else {
            return false;
        };
        let salted = gen_salted_password(password, &v.salt, v.iterations);
        match ScramSecret::verifier_from_salted_password(v.salt.clone(), salted, v.iterations) {
            ScramSecret::Verifier { stored_key, .. } => {
                stored_key.len() == v.stored_key.len()
                    && stored_key
                        .iter()
                        .zip(&v.stored_key)
                        .fold(0u8, |d, (a, b)| d | (a ^ b))
                        == 0
            }
            _ => false,
        }
    }

    /// `Authorization: Basic …` (the header's value) decoded and checked.
    pub fn check_basic(&self, header: &str) -> Option<String> {
        let encoded = header.trim().strip_prefix("Basic ")?;
        let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
        let (name, password) = decoded.split_once(':')?;
        self.check_password(name, password)
            .then(|| name.to_string())
    }

    pub fn get(&self, name: &str) -> Option<&User> {
        self.by_name.get(name).map(|(u, _)| u)
    }
}

/// Refuses to serve every client without a password beyond this machine.
pub fn check_listen(addr: &SocketAddr, logins: &Logins) -> Result<()> {
    if !logins.required() && !addr.ip().is_loopback() {
        return Err(Error::new(
            ErrorCode::BadArguments,
            format!(
                "refusing to listen on {addr} without [[users]]: with no users every client is trusted, which is only safe on loopback. Add users (see `sluice passwd`) or listen on 127.0.0.1"
            ),
        ));
    }
    Ok(())
}

/// The TLS acceptor for `[tls] cert` and `key` (PEM files).
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let fail = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        Error::new(
            ErrorCode::BadArguments,
            format!("[tls] {what} {}: {e}", path.display()),
        )
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| fail("cert", cert, &e))?;
    if certs.is_empty() {
        return Err(fail("cert", cert, &"no certificate in the file"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| fail("key", key, &e))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail("cert", cert, &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| fail("key", key, &e))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Where a login's SCRAM verifier comes from besides `[[users]]`: in upstream mode with
/// `auth_query`, the upstream's own `pg_authid` (PgBouncer's way), so a client logs in with its
/// PostgreSQL password and its statements run upstream as its role.
#[async_trait]
pub trait VerifierLookup: Send + Sync {
    /// The role's SCRAM verifier as `pg_authid.rolpassword` holds it; `Ok(None)` when there
    /// is no such role or no password (or not a SCRAM one).
    async fn scram_verifier(&self, role: &str) -> Result<Option<String>>;
}

/// How clients log in: against `[[users]]`, then the upstream's roles (`auth_query`); with
/// neither, every client is trusted (loopback only, see [`check_listen`]).
pub struct Logins {
    pub users: Arc<Users>,
    pub upstream: Option<Arc<dyn VerifierLookup>>,
}

impl Debug for Logins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logins")
            .field("users", &self.users)
            .field("upstream", &self.upstream.is_some())
            .finish()
    }
}

impl Logins {
    /// Whether a client must prove a password (else every client is trusted).
    pub fn required(&self) -> bool {
        !self.users.is_empty() || self.upstream.is_some()
    }

    /// Whether `name` may run workload DDL: everyone in trust mode, else the `[[users]]`
    /// marked `admin` (an upstream role is never one by its upstream rights alone).
    pub fn is_admin(&self, name: &str) -> bool {
        !self.required() || self.users.get(name).is_some_and(|u| u.admin)
    }

    /// `user`'s verifier: its `[[users]]` entry's, else the upstream's.
    async fn verifier(&self, user: &str) -> Result<Option<Verifier>> {
        if let Some((_, v)) = self.users.by_name.get(user) {
            return Ok(Some(v.clone()));
        }
        let Some(upstream) = &self.upstream else {
            return Ok(None);
        };
        Ok(match upstream.scram_verifier(user).await? {
            Some(text) => match parse_verifier(&text) {
                Ok(v) => Some(v),
                Err(_) => {
                    // An MD5 or plain password: sluice logs clients in with SCRAM only.
                    tracing::info!(
                        user,
                        "login refused: the role's upstream password is not a SCRAM-SHA-256 verifier (set password_encryption = 'scram-sha-256' and set the password again)"
                    );
                    None
                }
            },
            None => None,
        })
    }
}

/// One client's SCRAM-SHA-256 login, checked by pgwire's SCRAM server, which also reveals the
/// role's keys ([`ScramKeys`]): with them sluice logs in upstream as the client's role.
struct ScramLogin {
    logins: Arc<Logins>,
    server: ScramServerAuth,
    names: Vec<String>,
    waiting: Option<WaitingForProof>,
}

/// Between the server-first message and the client's proof.
struct WaitingForProof {
    exchange: ScramServerAuthWaitingForClientFinal,
    verifier: Verifier,
    client_first_bare: String,
    server_first: String,
}

impl ScramLogin {
    /// SCRAM-SHA-256; over TLS with a certificate, SCRAM-SHA-256-PLUS as well (channel
    /// binding: a client that uses it knows no one in the middle relayed its login). Never
    /// PLUS without TLS: libpq refuses a server that offers it there.
    fn new(logins: Arc<Logins>, cert_pem: Option<&[u8]>) -> ScramLogin {
        let mut server = ScramServerAuth::new();
        let mut names = vec![SCRAM_SHA_256_METHOD.to_owned()];
        // Checked once at start (`channel_binding_cert`); cannot fail here.
        if let Some(pem) = cert_pem {
            if server.configure_certificate(pem).is_ok() {
                names.push(SCRAM_SHA_256_PLUS_METHOD.to_owned());
            }
        }
        ScramLogin {
            logins,
            server,
            names,
            waiting: None,
        }
    }
}

fn scram_message(why: &str) -> PgWireError {
    PgWireError::InvalidScramMessage(why.to_owned())
}

/// The client's SASLInitialResponse, read only once its body is checked: pgwire's decoder
/// trusts the body (a password message sent in its place, or a data length past the end,
/// panics the connection's thread). What PostgreSQL refuses — FATAL 08P01 — is refused here.
fn sasl_initial_response(message: PasswordMessageFamily) -> PgWireResult<SASLInitialResponse> {
    if let PasswordMessageFamily::Raw(body) = &message {
        // mechanism name, NUL, Int32 length of the data (-1: none), the data.
        let well_formed = body.iter().position(|&b| b == 0).is_some_and(|nul| {
            let rest = &body[nul + 1..];
            rest.get(..4).is_some_and(|len| {
                let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
                (len == -1 && rest.len() == 4)
                    || usize::try_from(len).is_ok_and(|len| len == rest.len() - 4)
            })
        });
        if !well_formed {
            return Err(scram_message(
                "malformed SASLInitialResponse: expected a mechanism name, its data's length and the data",
            ));
        }
    }
    message.into_sasl_initial_response()
}

#[async_trait]
impl AuthMechanism<ScramKeys> for ScramLogin {
    async fn begin(
        &mut self,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> PgWireResult<AuthState<ScramKeys>> {
        Ok(AuthState::InProgress(Authentication::SASL(
            self.names.clone(),
        )))
    }

    async fn next(
        &mut self,
        client: &(dyn ClientInfo + Send + Sync),
        message: PasswordMessageFamily,
    ) -> PgWireResult<AuthState<ScramKeys>> {
        let Some(waiting) = self.waiting.take() else {
            let initial = sasl_initial_response(message)?;
            if !self.names.contains(&initial.auth_method) {
                return Err(PgWireError::UnsupportedSASLAuthMethod(initial.auth_method));
            }
            let data = initial
                .data
                .ok_or_else(|| scram_message("Empty client-first"))?;
            let user = client
                .metadata()
                .get(METADATA_USER)
                .cloned()
                .unwrap_or_default();
            let verifier = match self.logins.verifier(&user).await {
                Ok(Some(v)) => v,
                Ok(None) => {
                    tracing::info!(user, "login refused: no such user");
                    return Err(PgWireError::InvalidPassword(user));
                }
                Err(e) => {
                    tracing::warn!(user, "login refused: {e}");
                    return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                        "FATAL".to_owned(),
                        e.sqlstate().to_owned(),
                        e.to_string(),
                    ))));
                }
            };
            let secret = ScramSecret::Verifier {
                salt: verifier.salt.clone(),
                iterations: verifier.iterations,
                stored_key: verifier.stored_key.clone(),
                server_key: verifier.server_key.clone(),
            };
            let (server_first, exchange) = self
                .server
                .on_client_first_message_with_secret(&data, secret)?;
            // gs2-header = cbind-flag "," [authzid] "," — the bare message follows it.
            let client_first_bare = std::str::from_utf8(&data)
                .ok()
                .and_then(|text| text.splitn(3, ',').nth(2))
                .ok_or_else(|| scram_message("client-first has no gs2 header"))?
                .to_owned();
            self.waiting = Some(WaitingForProof {
                exchange,
                verifier,
                client_first_bare,
                server_first: server_first.clone(),
            });
            return Ok(AuthState::InProgress(Authentication::SASLContinue(
                server_first.into(),
            )));
        };
        let response = message.into_sasl_response()?;
        // pgwire checks the proof (and channel binding); then the same proof gives the keys.
        let server_final = waiting.exchange.on_client_final_message(&response.data)?;
        let keys = std::str::from_utf8(&response.data)
            .ok()
            .and_then(|text| text.rsplit_once(",p="))
            .and_then(|(without_proof, proof)| {
                let proof = STANDARD.decode(proof).ok()?;
                let auth_message = format!(
                    "{},{},{without_proof}",
                    waiting.client_first_bare, waiting.server_first
                );
                ScramKeys::from_proof(
                    &waiting.verifier.stored_key,
                    &waiting.verifier.server_key,
                    auth_message.as_bytes(),
                    &proof,
                )
            });
        Ok(AuthState::Ok {
            final_message: Some(Authentication::SASLFinal(server_final.into())),
            identity: keys,
        })
    }
}

/// The start-up of one connection: SCRAM when logins are required, else trust (loopback
/// only, see [`check_listen`]); then the connection's own start-up (its parameters, its
/// upstream session), which is the trust path's whole.
pub struct Startup<T> {
    /// `None`: every client is trusted.
    logins: Option<Arc<Logins>>,
    tls_cert_pem: Option<Arc<Vec<u8>>>,
    driver: AuthDriver<DefaultServerParameterProvider, ScramKeys>,
    /// The client's start-up packet, kept for the connection's start-up once the client has
    /// proven its password.
    startup: std::sync::Mutex<Option<pgwire::messages::startup::Startup>>,
    /// The connection: its start-up once the login is done.
    connection: Arc<T>,
}

impl<T> Debug for Startup<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Startup")
            .field("logins", &self.logins)
            .finish_non_exhaustive()
    }
}

impl<T: StartupHandler> Startup<T> {
    pub fn new(
        logins: &Arc<Logins>,
        tls_cert_pem: Option<Arc<Vec<u8>>>,
        connection: Arc<T>,
    ) -> Startup<T> {
        Startup {
            logins: logins.required().then(|| logins.clone()),
            tls_cert_pem,
            driver: AuthDriver::new(DefaultServerParameterProvider::default()),
            startup: std::sync::Mutex::new(None),
            connection,
        }
    }

    /// The login is done: the SCRAM server-final message, then the connection's own start-up
    /// (AuthenticationOk, its parameters, ReadyForQuery), with the role's keys kept in the
    /// client's session for its upstream connections.
    async fn logged_in<C>(
        &self,
        client: &mut C,
        keys: Option<ScramKeys>,
        final_message: Option<Authentication>,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Some(keys) = keys {
            client.session_extensions().insert(keys);
        }
        if let Some(message) = final_message {
            client
                .feed(PgWireBackendMessage::Authentication(message))
                .await?;
        }
        let saved = self
            .startup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(PgWireError::InvalidSASLState)?;
        // The version negotiated already, so the connection's start-up negotiates nothing.
        let mut startup = pgwire::messages::startup::Startup::new();
        (startup.protocol_number_major, startup.protocol_number_minor) =
            client.protocol_version().version_number();
        startup.parameters = saved.parameters;
        self.connection
            .on_startup(client, PgWireFrontendMessage::Startup(startup))
            .await
    }
}

/// The certificate PEM for SCRAM channel binding, if its signature algorithm allows the
/// `tls-server-end-point` binding; otherwise clients get plain SCRAM-SHA-256 (and a warning
/// says why).
pub fn channel_binding_cert(cert: &Path) -> Option<Arc<Vec<u8>>> {
    let pem = std::fs::read(cert).ok()?;
    match ScramServerAuth::new().configure_certificate(&pem) {
        Ok(()) => Some(Arc::new(pem)),
        Err(e) => {
            tracing::warn!(
                "[tls] cert {}: no SCRAM channel binding (SCRAM-SHA-256-PLUS): {e}",
                cert.display()
            );
            None
        }
    }
}

#[async_trait]
impl<T> StartupHandler for Startup<T>
where
    T: StartupHandler + Send + Sync,
{
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Some(logins) = &self.logins else {
            return self.connection.on_startup(client, message).await;
        };
        let outcome = match message {
            PgWireFrontendMessage::Startup(startup) => {
                protocol_negotiation(client, &startup).await?;
                save_startup_parameters_to_metadata(client, &startup);
                *self.startup.lock().unwrap_or_else(|p| p.into_inner()) = Some(startup);
                let cert = self.tls_cert_pem.as_deref().filter(|_| client.is_secure());
                let login = ScramLogin::new(logins.clone(), cert.map(Vec::as_slice));
                self.driver
                    .begin_authentication(client, Box::new(login))
                    .await
            }
            PgWireFrontendMessage::PasswordMessageFamily(message) => {
                self.driver.advance_authentication(client, message).await
            }
            // Anything else while the exchange is under way ends it, in PostgreSQL's words.
            other => {
                let mut encoded = bytes::BytesMut::new();
                let tag = other.encode(&mut encoded).map_or(0, |()| encoded[0]);
                return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "FATAL".to_owned(),
                    "08P01".to_owned(),
                    format!("expected SASL response, got message type {tag}"),
                ))));
            }
        };
        match outcome {
            Ok(AuthOutcome::InProgress) => Ok(()),
            Ok(AuthOutcome::Authenticated {
                identity,
                final_message,
            }) => self.logged_in(client, identity, final_message).await,
            // PostgreSQL's words, whatever the reason (a wrong password, no such role: a
            // client cannot tell them apart, as going direct). libpq leaves the SCRAM user name
            // empty (the start-up message has it), so the start-up's name is the one told.
            Err(PgWireError::InvalidPassword(_)) => {
                let user = client
                    .metadata()
                    .get(METADATA_USER)
                    .cloned()
                    .unwrap_or_default();
                Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "FATAL".to_owned(),
                    "28P01".to_owned(),
                    format!("password authentication failed for user \"{user}\""),
                ))))
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, scram: &str) -> User {
        User {
            name: name.into(),
            scram: scram.into(),
            admin: false,
            default_workload: None,
            pinned_workload: None,
            max_execution_time: None,
            admission_timeout: None,
        }
    }

    #[test]
    fn verifiers_round_trip_and_bad_ones_are_named() {
        let v = make_verifier("pencil").expect("verifier");
        assert!(v.starts_with("SCRAM-SHA-256$4096:"), "{v}");
        assert!(!v.contains("pencil"));
        let parsed = parse_verifier(&v).expect("parses");
        assert_eq!(parsed.salt.len(), 16);
        // Two verifiers of one password differ (random salts).
        assert_ne!(make_verifier("pencil").expect("verifier"), v);
        let e = Users::new(vec![user("ann", "pencil")]).expect_err("plain password");
        assert!(e.message.contains("[[users]] 'ann': scram"), "{e}");
        let e = Users::new(vec![user("ann", &v), user("ann", &v)]).expect_err("twice");
        assert!(e.message.contains("twice"), "{e}");
        let users = Users::new(vec![User {
            admin: true,
            ..user("root", &v)
        }])
        .expect("valid");
        let logins = |users: Users| Logins {
            users: Arc::new(users),
            upstream: None,
        };
        assert!(logins(users).is_admin("root"));
        assert!(!logins(Users::new(vec![user("ann", &v)]).expect("valid")).is_admin("ann"));
        assert!(logins(Users::default()).is_admin("anyone"));
    }

    #[test]
    fn trust_mode_stays_on_loopback() {
        let logins = |users: Users| Logins {
            users: Arc::new(users),
            upstream: None,
        };
        let none = logins(Users::default());
        assert!(check_listen(&"127.0.0.1:6543".parse().expect("addr"), &none).is_ok());
        assert!(check_listen(&"[::1]:6543".parse().expect("addr"), &none).is_ok());
        let e = check_listen(&"0.0.0.0:6543".parse().expect("addr"), &none).expect_err("open");
        assert!(
            e.message.contains("refusing to listen on 0.0.0.0:6543"),
            "{e}"
        );
        let v = make_verifier("x").expect("verifier");
        let some = logins(Users::new(vec![user("ann", &v)]).expect("valid"));
        assert!(check_listen(&"0.0.0.0:6543".parse().expect("addr"), &some).is_ok());
    }
}
