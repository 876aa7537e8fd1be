//! Who may connect and what they may do: `[[users]]` with SCRAM-SHA-256 verifiers, the trust
//! mode for loopback when no users are configured, TLS, and each user's workload rules.
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
use futures::Sink;
use pgwire::api::auth::sasl::scram::{gen_salted_password, ScramAuth, ScramSecret};
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{
    AuthSource, DefaultServerParameterProvider, LoginInfo, Password, ServerParameterProvider,
    StartupHandler,
};
use pgwire::api::{ClientInfo, ConnectionManager, METADATA_USER};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
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

    /// Whether `name` may run workload DDL: everyone in trust mode, else admins.
    pub fn is_admin(&self, name: &str) -> bool {
        self.is_empty() || self.get(name).is_some_and(|u| u.admin)
    }
}

/// Refuses to serve every client without a password beyond this machine.
pub fn check_listen(addr: &SocketAddr, users: &Users) -> Result<()> {
    if users.is_empty() && !addr.ip().is_loopback() {
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

/// The users as pgwire's SCRAM mechanism asks for them: verifiers only.
#[derive(Debug)]
struct VerifierSource(Arc<Users>);

#[async_trait]
impl AuthSource for VerifierSource {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        // Only SCRAM is offered, which asks for the verifier below; there is no password.
        Err(PgWireError::InvalidPassword(
            login.user().unwrap_or_default().to_owned(),
        ))
    }

    async fn get_scram_secret(&self, login: &LoginInfo) -> PgWireResult<(ScramSecret, Option<()>)> {
        let user = login.user().unwrap_or_default();
        let Some((_, v)) = self.0.by_name.get(user) else {
            tracing::info!(user, "login refused: no such user");
            return Err(PgWireError::InvalidPassword(user.to_owned()));
        };
        Ok((
            ScramSecret::Verifier {
                salt: v.salt.clone(),
                iterations: v.iterations,
                stored_key: v.stored_key.clone(),
                server_key: v.server_key.clone(),
            },
            None,
        ))
    }
}

/// The start-up of one connection: SCRAM when users are configured, else trust (loopback
/// only, see [`check_listen`]); then the connection's start-up options.
pub struct Startup<T> {
    /// Kept until the first message says whether the connection is TLS.
    scram: Option<ScramSetup>,
    sasl: std::sync::OnceLock<SASLAuthStartupHandler<Parameters>>,
    /// The connection: its trust start-up, and where the start-up options go.
    connection: Arc<T>,
}

/// What a connection does with its start-up parameters (`options=-c workload=x`).
pub trait StartupOptions {
    fn apply_startup_options(&self, metadata: &std::collections::HashMap<String, String>);
    /// Start-up parameters announced besides pgwire's defaults (replacing them by name).
    fn server_parameters(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// pgwire's start-up parameters, with a connection's own in place of them by name.
#[derive(Debug)]
pub struct Parameters(pub Vec<(String, String)>);

impl ServerParameterProvider for Parameters {
    fn server_parameters<C>(&self, client: &C) -> Option<std::collections::HashMap<String, String>>
    where
        C: ClientInfo,
    {
        let mut all = DefaultServerParameterProvider::default().server_parameters(client)?;
        for (name, value) in &self.0 {
            all.insert(name.clone(), value.clone());
        }
        Some(all)
    }
}

struct ScramSetup {
    users: Arc<Users>,
    tls_cert_pem: Option<Arc<Vec<u8>>>,
    manager: Arc<ConnectionManager>,
}

impl<T> Debug for Startup<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Startup")
            .field("scram", &self.scram.is_some())
            .finish_non_exhaustive()
    }
}

impl<T: StartupOptions> Startup<T> {
    pub fn new(
        users: &Arc<Users>,
        tls_cert_pem: Option<Arc<Vec<u8>>>,
        connection: Arc<T>,
        manager: Arc<ConnectionManager>,
    ) -> Startup<T> {
        Startup {
            scram: (!users.is_empty()).then(|| ScramSetup {
                users: users.clone(),
                tls_cert_pem,
                manager,
            }),
            sasl: std::sync::OnceLock::new(),
            connection,
        }
    }

    /// SCRAM-SHA-256; over TLS with a certificate, SCRAM-SHA-256-PLUS as well (channel
    /// binding: a client that uses it knows no one in the middle relayed its login). Never
    /// PLUS without TLS: libpq refuses a server that offers it there.
    fn sasl(&self, secure: bool) -> Option<&SASLAuthStartupHandler<Parameters>> {
        let setup = self.scram.as_ref()?;
        Some(self.sasl.get_or_init(|| {
            let mut scram = ScramAuth::new(Arc::new(VerifierSource(setup.users.clone())));
            if let Some(pem) = setup.tls_cert_pem.as_ref().filter(|_| secure) {
                // Checked once at start (`channel_binding_cert`); cannot fail here.
                let _ = scram.configure_certificate(pem);
            }
            SASLAuthStartupHandler::new(Arc::new(Parameters(self.connection.server_parameters())))
                .with_scram(scram)
                .with_connection_manager(setup.manager.clone())
        }))
    }
}

/// The certificate PEM for SCRAM channel binding, if its signature algorithm allows the
/// `tls-server-end-point` binding; otherwise clients get plain SCRAM-SHA-256 (and a warning
/// says why).
pub fn channel_binding_cert(cert: &Path) -> Option<Arc<Vec<u8>>> {
    let pem = std::fs::read(cert).ok()?;
    let mut probe = ScramAuth::new(Arc::new(VerifierSource(Arc::default())));
    match probe.configure_certificate(&pem) {
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
    T: StartupHandler + StartupOptions + Send + Sync,
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
        match self.sasl(client.is_secure()) {
            None => self.connection.on_startup(client, message).await,
            Some(sasl) => {
                let is_startup = matches!(message, PgWireFrontendMessage::Startup(_));
                sasl.on_startup(client, message)
                    .await
                    .map_err(|e| match e {
                        // libpq leaves the SCRAM user name empty (the start-up message has it),
                        // so pgwire's message would say user "".
                        PgWireError::InvalidPassword(name) if name.is_empty() => {
                            PgWireError::InvalidPassword(
                                client
                                    .metadata()
                                    .get(METADATA_USER)
                                    .cloned()
                                    .unwrap_or_default(),
                            )
                        }
                        e => e,
                    })?;
                if is_startup {
                    self.connection.apply_startup_options(client.metadata());
                }
                Ok(())
            }
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
        assert!(users.is_admin("root"));
        assert!(!users.is_admin("ann"));
        assert!(Users::default().is_admin("anyone"));
    }

    #[test]
    fn trust_mode_stays_on_loopback() {
        let none = Users::default();
        assert!(check_listen(&"127.0.0.1:6543".parse().expect("addr"), &none).is_ok());
        assert!(check_listen(&"[::1]:6543".parse().expect("addr"), &none).is_ok());
        let e = check_listen(&"0.0.0.0:6543".parse().expect("addr"), &none).expect_err("open");
        assert!(
            e.message.contains("refusing to listen on 0.0.0.0:6543"),
            "{e}"
        );
        let v = make_verifier("x").expect("verifier");
        let some = Users::new(vec![user("ann", &v)]).expect("valid");
        assert!(check_listen(&"0.0.0.0:6543".parse().expect("addr"), &some).is_ok());
    }
}
