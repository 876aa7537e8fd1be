//! TLS to the upstream, as libpq's `sslmode` asks: `prefer` encrypts when the upstream offers
//! it, `require` insists on encryption (the certificate is not checked, as libpq does without
//! a root certificate), `verify-ca` and `verify-full` also check the certificate against the
//! URL's `sslrootcert` and the host's name.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use sluice_sql::{Error, ErrorCode, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{DigitallySignedStruct, SignatureScheme};

use super::{unreachable, SslMode, UpstreamUrl};

/// PostgreSQL's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 4, 210, 22, 47];

/// A connection to the upstream, in the clear or encrypted.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    /// Whether the upstream closed the connection or sent something unasked; reads nothing
    /// when it did neither.
    pub fn is_quiet(&mut self) -> bool {
        match self {
            Stream::Plain(s) => {
                let mut probe = [0u8; 1];
                matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Stream::Tls(s) => {
                // A read that would wait: nothing came. The no-op waker is replaced by the
                // next real read's.
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut probe = [0u8; 1];
                let mut buf = ReadBuf::new(&mut probe);
                matches!(
                    Pin::new(s.as_mut()).poll_read(&mut cx, &mut buf),
                    Poll::Pending
                )
            }
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// `tcp` as the URL's `sslmode` asks: asks the upstream for TLS (unless `disable`) and
/// negotiates it, or stays in the clear where `prefer` allows.
pub async fn negotiate(mut tcp: TcpStream, url: &UpstreamUrl, address: &str) -> Result<Stream> {
    if url.sslmode == SslMode::Disable {
        return Ok(Stream::Plain(tcp));
    }
    let lost = |e: io::Error| unreachable(address, &e.to_string());
    tcp.write_all(&SSL_REQUEST).await.map_err(lost)?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.map_err(lost)?;
    match (answer[0], url.sslmode) {
        (b'S', _) => {}
        (b'N', SslMode::Prefer) => return Ok(Stream::Plain(tcp)),
        (b'N', mode) => {
            return Err(Error::new(
                ErrorCode::AllConnectionTriesFailed,
                format!("The upstream {address} does not accept TLS, and the upstream URL asks for it (sslmode={}); turn on ssl there, or use sslmode=prefer", mode.name()),
            ))
        }
        (other, _) => {
            return Err(Error::new(
                ErrorCode::AllConnectionTriesFailed,
                format!("The upstream {address} answered the TLS request with '{}'", other as char),
            ))
        }
    }
    let config = client_config(url)?;
    let name = ServerName::try_from(url.host.clone()).map_err(|e| {
        Error::new(
            ErrorCode::BadArguments,
            format!(
                "The upstream host '{}' is not a name TLS can check: {e}",
                url.host
            ),
        )
    })?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| {
            Error::new(
                ErrorCode::AllConnectionTriesFailed,
                format!("TLS with the upstream {address} failed: {e}"),
            )
        })?;
    Ok(Stream::Tls(Box::new(tls)))
}

fn client_config(url: &UpstreamUrl) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::new(ErrorCode::InternalError, format!("TLS set-up: {e}")))?;
    Ok(match url.sslmode {
        SslMode::VerifyFull => {
            let path = url.sslrootcert.as_ref().ok_or_else(|| {
                Error::new(
                    ErrorCode::BadArguments,
                    "sslmode=verify-ca|verify-full needs the upstream URL's sslrootcert=PATH (the CA certificate to check the upstream's against)",
                )
            })?;
            let mut roots = rustls::RootCertStore::empty();
            let pem = std::fs::read(path).map_err(|e| {
                Error::new(
                    ErrorCode::BadArguments,
                    format!("sslrootcert {}: {e}", path.display()),
                )
            })?;
            use rustls::pki_types::pem::PemObject;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| {
                    Error::new(
                        ErrorCode::BadArguments,
                        format!("sslrootcert {}: {e}", path.display()),
                    )
                })?;
                roots.add(cert).map_err(|e| {
                    Error::new(
                        ErrorCode::BadArguments,
                        format!("sslrootcert {}: {e}", path.display()),
                    )
                })?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        _ => unchecked(builder, provider),
    })
}

/// libpq's `sslmode=require`: a TLS client that encrypts without checking who holds the
/// server's certificate (see [`Unchecked`]). Also what a test client that must reach a
/// server with a made-up certificate connects with (the wire fuzzer's).
pub fn unchecked_client_config() -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::new(ErrorCode::InternalError, format!("TLS set-up: {e}")))?;
    Ok(unchecked(builder, provider))
}

fn unchecked(
    builder: rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> rustls::ClientConfig {
    builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
        .with_no_client_auth()
}

/// `require`/`prefer`: encryption without checking who is at the other end (libpq's meaning
/// of those modes); signatures are still checked, so the session is the certificate holder's.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
