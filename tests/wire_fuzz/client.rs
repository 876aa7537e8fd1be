//! Running a case against the server: the steps written in order (in random pieces when the
//! case is chunked), the server's answers read alongside, and what a real client does in the
//! middle of a conversation — the SCRAM exchange answering the server's nonce, a
//! CancelRequest on a second connection with the key the server gave, a TLS handshake (or a
//! spoiled one) when a case begins by asking for TLS — carried out. The client never trusts
//! the server to answer: every wait is bounded, and a write the server does not take within a
//! second ends the case (the server may stop reading a client that does not read its
//! results).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::{digest, hmac, pbkdf2};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::rustls;

use crate::case::{
    frame, single_byte_requests, untagged, CancelTarget, Case, Ending, ScramSpoil, Step, TlsWay,
    CANCEL_REQUEST,
};
use crate::mutate::{bend_bytes, Rng};

/// A case's connection, each way: TCP's halves, or TLS's.
type Reader = Box<dyn AsyncRead + Unpin + Send>;
type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// A password, a salt and a number of iterations.
type SaltedFor = (String, Vec<u8>, u32);

/// The server under test and who the cases log in as.
#[derive(Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub user: String,
    pub database: String,
    pub password: String,
    /// SCRAM's salted passwords, by password, salt and iterations: PBKDF2 runs once per salt,
    /// not once per case.
    salted: Mutex<HashMap<SaltedFor, [u8; 32]>>,
    /// The client's TLS: any certificate is taken (the server is under test, not its
    /// certificate).
    tls: Arc<rustls::ClientConfig>,
}

impl Target {
    pub fn new(addr: SocketAddr, user: &str, database: &str, password: &str) -> Target {
        Target {
            addr,
            user: user.into(),
            database: database.into(),
            password: password.into(),
            salted: Mutex::default(),
            tls: any_certificate(),
        }
    }

    fn salted(&self, password: &str, salt: &[u8], iterations: u32) -> [u8; 32] {
        let key = (password.to_string(), salt.to_vec(), iterations);
        let mut cache = self.salted.lock().expect("cache");
        *cache.entry(key).or_insert_with(|| {
            let mut out = [0u8; 32];
            pbkdf2::derive(
                pbkdf2::PBKDF2_HMAC_SHA256,
                NonZeroU32::new(iterations.max(1)).expect("> 0"),
                salt,
                password.as_bytes(),
                &mut out,
            );
            out
        })
    }
}

/// What the server sent on a case's connection.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// ReadyForQuery messages.
    pub ready: usize,
    /// The server closed the connection (or reset it).
    pub closed: bool,
    /// BackendKeyData: process id and secret.
    pub key: Option<(i32, i32)>,
    /// Authentication messages: their code and the rest of their body.
    pub auth: Vec<(i32, Vec<u8>)>,
    /// ErrorResponse messages, as `SQLSTATE message`.
    pub errors: Vec<String>,
    /// DataRow messages, and the first one's first column.
    pub rows: usize,
    pub first_value: Option<Vec<u8>>,
    /// Bytes that are not a backend message (a finding, unless the case asked for TLS).
    pub broken: Option<String>,
    /// The server answered 'S' to an SSLRequest: what follows is TLS, not read as messages.
    pub tls: bool,
    /// The case ran inside TLS (a handshake completed).
    pub encrypted: bool,
}

/// Reads the server's messages into `seen` until it closes, beginning with the bytes of
/// `read_already`. `single` counts SSL/GSS requests sent and not yet answered: their answer is
/// one byte, not a message.
async fn read(
    mut from: Reader,
    read_already: Vec<u8>,
    seen: watch::Sender<Seen>,
    single: Arc<AtomicUsize>,
) {
    // What was read already is the start of a message: it is parsed with what follows it.
    let mut buf: Vec<u8> = read_already;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                seen.send_modify(|s| s.closed = true);
                return;
            }
            Ok(n) => n,
        };
        if seen.borrow().tls || seen.borrow().broken.is_some() {
            continue;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            let Some(&tag) = rest.first() else { break };
            if single.load(Ordering::SeqCst) > 0 && matches!(tag, b'S' | b'N' | b'G') {
                single.fetch_sub(1, Ordering::SeqCst);
                at += 1;
                if tag == b'S' {
                    seen.send_modify(|s| s.tls = true);
                    break;
                }
                continue;
            }
            if rest.len() < 5 {
                break;
            }
            let len = i32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
            if !(4..=256 << 20).contains(&len) {
                let head: Vec<u8> = rest.iter().take(16).copied().collect();
                seen.send_modify(|s| {
                    s.broken = Some(format!("tag {tag:?} length {len}: {head:02x?}"));
                });
                break;
            }
            let end = 1 + len as usize;
            if rest.len() < end {
                break;
            }
            let body = &rest[5..end];
            seen.send_modify(|s| message(s, tag, body));
            at += end;
        }
        buf.drain(..at);
    }
}

/// Notes one backend message.
fn message(seen: &mut Seen, tag: u8, body: &[u8]) {
    match tag {
        b'Z' => seen.ready += 1,
        b'K' if body.len() >= 8 => {
            let pid = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
            let secret = i32::from_be_bytes([body[4], body[5], body[6], body[7]]);
            seen.key = Some((pid, secret));
        }
        b'R' if body.len() >= 4 => {
            let code = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
            seen.auth.push((code, body[4..].to_vec()));
        }
        b'E' => {
            let field = |f: u8| {
                body.split(|b| *b == 0)
                    .find(|part| part.first() == Some(&f))
                    .map(|part| String::from_utf8_lossy(&part[1..]).into_owned())
                    .unwrap_or_default()
            };
            if seen.errors.len() < 20 {
                seen.errors.push(format!("{} {}", field(b'C'), field(b'M')));
            }
        }
        b'D' => {
            if seen.rows == 0 && body.len() >= 6 {
                let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                seen.first_value = usize::try_from(len)
                    .ok()
                    .and_then(|len| body.get(6..6 + len))
                    .map(<[u8]>::to_vec);
            }
            seen.rows += 1;
        }
        _ => {}
    }
}

/// Waits (at most `limit`) until `until` holds of what was seen; whether it did.
async fn wait(
    seen: &mut watch::Receiver<Seen>,
    limit: Duration,
    until: impl FnMut(&Seen) -> bool,
) -> bool {
    matches!(
        tokio::time::timeout(limit, seen.wait_for(until)).await,
        Ok(Ok(_))
    )
}

/// Writes `bytes` (in random pieces when `chunked`); false when the server did not take them
/// within a second or closed.
async fn write(to: &mut Writer, bytes: &[u8], chunked: bool, rng: &mut Rng) -> bool {
    let mut rest = bytes;
    while !rest.is_empty() {
        // At most about eight pieces: a big message is not sent a byte at a time.
        let n = if chunked {
            (1 + rng.below(rest.len().min(64)))
                .max(bytes.len() / 8)
                .min(rest.len())
        } else {
            rest.len()
        };
        let sent = tokio::time::timeout(Duration::from_secs(1), to.write_all(&rest[..n])).await;
        if !matches!(sent, Ok(Ok(()))) {
            return false;
        }
        rest = &rest[n..];
        if chunked && !rest.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    true
}

/// The SCRAM-SHA-256 exchange (RFC 5802, as libpq does it without channel binding): waits for
/// the server's AuthenticationSASL, sends client-first, reads server-first, sends the proof.
/// False when the connection is done.
async fn scram(
    to: &mut Writer,
    seen: &mut watch::Receiver<Seen>,
    target: &Target,
    spoil: ScramSpoil,
    rng: &mut Rng,
    patience: Duration,
) -> bool {
    let asked = wait(seen, patience, |s| {
        s.closed || s.auth.iter().any(|(code, _)| *code == 10)
    })
    .await;
    if !asked || seen.borrow().closed {
        return !seen.borrow().closed;
    }
    let nonce = format!("{:016x}{:016x}", rng.next(), rng.next());
    let client_first_bare = format!("n=,r={nonce}");
    let mut body = b"SCRAM-SHA-256\0".to_vec();
    let first = format!("n,,{client_first_bare}");
    body.extend_from_slice(&(first.len() as i32).to_be_bytes());
    body.extend_from_slice(first.as_bytes());
    let answers_before = seen.borrow().auth.len();
    if !write(to, &frame(b'p', &body), false, rng).await {
        return false;
    }
    let continued = wait(seen, patience, |s| {
        s.closed || s.auth[answers_before..].iter().any(|(code, _)| *code == 11)
    })
    .await;
    let server_first = {
        let seen = seen.borrow();
        match seen.auth[answers_before..]
            .iter()
            .find(|(code, _)| *code == 11)
        {
            Some((_, body)) if continued => String::from_utf8_lossy(body).into_owned(),
            _ => return !seen.closed,
        }
    };
    let attribute = |name: &str| {
        server_first
            .split(',')
            .find_map(|a| a.strip_prefix(name))
            .unwrap_or_default()
            .to_string()
    };
    let (combined, salt) = (
        attribute("r="),
        STANDARD.decode(attribute("s=")).unwrap_or_default(),
    );
    let iterations: u32 = attribute("i=").parse().unwrap_or(4096);
    let password = match spoil {
        ScramSpoil::BadProof => "not the password",
        _ => target.password.as_str(),
    };
    let salted = target.salted(password, &salt, iterations);
    let without_proof = format!("c=biws,r={combined}");
    let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
    let salted_key = hmac::Key::new(hmac::HMAC_SHA256, &salted);
    let client_key = hmac::sign(&salted_key, b"Client Key");
    let stored_key = digest::digest(&digest::SHA256, client_key.as_ref());
    let signature = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, stored_key.as_ref()),
        auth_message.as_bytes(),
    );
    let proof: Vec<u8> = client_key
        .as_ref()
        .iter()
        .zip(signature.as_ref())
        .map(|(a, b)| a ^ b)
        .collect();
    let mut last = format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes();
    if spoil == ScramSpoil::Cut {
        last.truncate(last.len() / 2);
    }
    write(to, &frame(b'p', &last), false, rng).await
}

/// A CancelRequest on a connection of its own, read until the server closes it (≤ 1 s).
async fn cancel(addr: SocketAddr, key: (i32, i32)) {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return;
    };
    let mut body = key.0.to_be_bytes().to_vec();
    body.extend_from_slice(&key.1.to_be_bytes());
    if stream
        .write_all(&untagged(CANCEL_REQUEST, &body))
        .await
        .is_ok()
    {
        let mut sink = [0u8; 64];
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut sink)).await;
    }
}

/// How a case's connection goes on after its leading `tls` steps.
enum Opened {
    /// Plain (no TLS asked for, or refused).
    Plain,
    /// Inside TLS.
    Tls,
    /// TLS accepted, its ClientHello spoiled: the rest is sent raw.
    Spoiled,
}

/// What the server said to an SSLRequest.
enum Asked {
    /// 'S'; for a spoiled handshake, the spoiled ClientHello has been sent.
    Accepted,
    /// 'N'.
    Refused,
    /// Something else (its first byte), or nothing within the patience.
    Answered(Option<u8>),
}

/// Sends an SSLRequest and reads the one-byte answer; if the server accepts and `way` spoils
/// the handshake, sends a ClientHello cut short or bent.
async fn ask_for_tls(
    tcp: &mut TcpStream,
    way: TlsWay,
    config: &Arc<rustls::ClientConfig>,
    rng: &mut Rng,
    patience: Duration,
) -> std::io::Result<Asked> {
    let request = Step::Tls(way).bytes().expect("an SSLRequest");
    if tcp.write_all(&request).await.is_err() {
        return Ok(Asked::Answered(None));
    }
    let mut answer = [0u8; 1];
    match tokio::time::timeout(patience * 4, tcp.read(&mut answer)).await {
        Ok(Ok(1)) if answer[0] == b'N' => return Ok(Asked::Refused),
        Ok(Ok(1)) if answer[0] == b'S' => {}
        Ok(Ok(1)) => return Ok(Asked::Answered(Some(answer[0]))),
        _ => return Ok(Asked::Answered(None)),
    }
    if way == TlsWay::Handshake {
        return Ok(Asked::Accepted);
    }
    // A real client's first flight, spoiled.
    let mut client = rustls::ClientConnection::new(
        config.clone(),
        rustls::pki_types::ServerName::try_from("localhost").expect("a name"),
    )
    .map_err(std::io::Error::other)?;
    let mut hello = Vec::new();
    client.write_tls(&mut hello)?;
    match way {
        TlsWay::Cut => hello.truncate(rng.below(hello.len())),
        _ => bend_bytes(&mut hello, rng),
    }
    let _ = tcp.write_all(&hello).await;
    Ok(Asked::Accepted)
}

/// A TLS client that takes any certificate the server shows (libpq's `sslmode=require`; the
/// signatures in the handshake still checked).
fn any_certificate() -> Arc<rustls::ClientConfig> {
    Arc::new(sluice_engine::upstream::tls::unchecked_client_config().expect("TLS set-up"))
}

/// Runs `case` on a new connection; what the server sent. Each wait for answers lasts at most
/// `patience`.
pub async fn run(
    target: &Arc<Target>,
    case: &Case,
    rng: &mut Rng,
    patience: Duration,
) -> std::io::Result<Seen> {
    let mut crowd = tokio::task::JoinSet::new();
    let seen = converse(target, case, rng, patience, &mut crowd).await;
    // The crowd goes too (each member within a second or so; bounded here regardless).
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while crowd.join_next().await.is_some() {}
    })
    .await;
    crowd.abort_all();
    seen
}

/// Other clients at once ([`Step::Crowd`]): each logs in, sends `sql`, and goes at a random
/// moment — dropped while queued or running, cancelled, or after its answer.
fn join_crowd(
    crowd: &mut tokio::task::JoinSet<()>,
    target: &Arc<Target>,
    sql: &[u8],
    rng: &mut Rng,
    patience: Duration,
) {
    let mut steps = vec![
        Step::Startup(vec![
            ("user".into(), target.user.clone()),
            ("database".into(), target.database.clone()),
        ]),
        Step::Scram(ScramSpoil::None),
        Step::Await,
        Step::Query(sql.to_vec()),
        Step::Sleep(rng.below(300) as u64),
    ];
    let ending = match rng.below(3) {
        0 => Ending::Drop,
        1 => {
            steps.push(Step::Cancel(CancelTarget::Own));
            Ending::Read
        }
        _ => Ending::Read,
    };
    let member = Case {
        steps,
        ending,
        chunked: false,
    };
    let (target, mut rng) = (target.clone(), Rng::new(rng.next()));
    let mut none = tokio::task::JoinSet::new();
    // Boxed: a member's conversation is the same function as the case's.
    let future: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
        Box::pin(async move {
            let _ = converse(&target, &member, &mut rng, patience, &mut none).await;
        });
    crowd.spawn(future);
}

async fn converse(
    target: &Arc<Target>,
    case: &Case,
    rng: &mut Rng,
    patience: Duration,
    crowd: &mut tokio::task::JoinSet<()>,
) -> std::io::Result<Seen> {
    let mut tcp = TcpStream::connect(target.addr).await?;
    tcp.set_nodelay(true)?;
    // The leading `tls` steps, before anything reads the answers as messages.
    let leading = case
        .steps
        .iter()
        .take_while(|s| matches!(s, Step::Tls(_)))
        .count();
    let mut opened = Opened::Plain;
    let mut read_already = Vec::new();
    for step in &case.steps[..leading] {
        let Step::Tls(way) = step else { break };
        match ask_for_tls(&mut tcp, *way, &target.tls, rng, patience).await? {
            Asked::Refused => continue,
            Asked::Answered(byte) => {
                // Not an answer to the request (an error message's first byte, say): read
                // with what follows.
                read_already = byte.into_iter().collect();
                break;
            }
            Asked::Accepted => {}
        }
        opened = match way {
            TlsWay::Handshake => Opened::Tls,
            TlsWay::Cut | TlsWay::Bent => Opened::Spoiled,
        };
        break;
    }
    let (tx, mut seen) = watch::channel(Seen {
        // After a spoiled handshake the server's bytes are TLS alerts, not messages.
        tls: matches!(opened, Opened::Spoiled),
        encrypted: matches!(opened, Opened::Tls),
        ..Seen::default()
    });
    let (from, mut to): (Reader, Writer) = match opened {
        Opened::Tls => {
            let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
            let connect = tokio_rustls::TlsConnector::from(target.tls.clone()).connect(name, tcp);
            // The server under test must complete a real client's handshake.
            let tls = tokio::time::timeout(Duration::from_secs(10), connect)
                .await
                .map_err(|_| std::io::Error::other("the TLS handshake took over 10 s"))?
                .map_err(|e| std::io::Error::other(format!("the TLS handshake failed: {e}")))?;
            let (from, to) = tokio::io::split(tls);
            (Box::new(from), Box::new(to))
        }
        Opened::Plain | Opened::Spoiled => {
            let (from, to) = tcp.into_split();
            (Box::new(from), Box::new(to))
        }
    };
    let single = Arc::new(AtomicUsize::new(0));
    let reader = tokio::spawn(read(from, read_already, tx, single.clone()));
    let mut ready_expected = 0;
    for step in &case.steps[leading..] {
        if seen.borrow().closed {
            break;
        }
        match step {
            Step::Scram(spoil) => {
                if !scram(&mut to, &mut seen, target, *spoil, rng, patience).await {
                    break;
                }
            }
            Step::Cancel(whose) => {
                let key = match whose {
                    CancelTarget::Own => seen.borrow().key,
                    CancelTarget::Other => Some((rng.next() as i32, rng.next() as i32)),
                };
                if let Some(key) = key {
                    cancel(target.addr, key).await;
                }
            }
            Step::Await => {
                let want = ready_expected;
                wait(&mut seen, patience, |s| s.closed || s.ready >= want).await;
                // What did not come will not: later awaits count from here.
                ready_expected = seen.borrow().ready;
            }
            Step::Sleep(ms) => tokio::time::sleep(Duration::from_millis((*ms).min(500))).await,
            Step::Crowd(n, sql) => {
                for _ in 0..(*n).min(16) {
                    join_crowd(crowd, target, sql, rng, patience);
                }
            }
            message => {
                let bytes = message.bytes().unwrap_or_default();
                single.fetch_add(single_byte_requests(&bytes), Ordering::SeqCst);
                if !write(&mut to, &bytes, case.chunked, rng).await {
                    break;
                }
                if message.expects_ready() || matches!(message, Step::Startup(_)) {
                    ready_expected += 1;
                }
            }
        }
    }
    match case.ending {
        Ending::Drop => {}
        Ending::Read => {
            let want = ready_expected;
            wait(&mut seen, patience, |s| s.closed || s.ready >= want).await;
        }
        Ending::HalfClose => {
            let _ = to.shutdown().await;
            wait(&mut seen, patience, |s| s.closed).await;
        }
    }
    drop(to);
    reader.abort();
    let seen = seen.borrow().clone();
    Ok(seen)
}

/// A fresh client's round trip: logs in and runs `SELECT 1`; Err says what went wrong.
pub async fn answers(target: &Arc<Target>, rng: &mut Rng) -> Result<(), String> {
    let case = Case {
        steps: vec![
            Step::Startup(vec![
                ("user".into(), target.user.clone()),
                ("database".into(), target.database.clone()),
            ]),
            Step::Scram(ScramSpoil::None),
            Step::Await,
            Step::Query(b"SELECT 1".to_vec()),
            Step::Await,
            Step::Terminate,
        ],
        ending: Ending::Read,
        chunked: false,
    };
    let seen = tokio::time::timeout(
        Duration::from_secs(20),
        run(target, &case, rng, Duration::from_secs(10)),
    )
    .await
    .map_err(|_| "a fresh client got no answer in 20 s".to_string())?
    .map_err(|e| format!("a fresh client could not connect: {e}"))?;
    let logged_in = seen.auth.iter().any(|(code, _)| *code == 0);
    if !logged_in
        || seen.ready < 2
        || seen.first_value.as_deref() != Some(b"1")
        || !seen.errors.is_empty()
    {
        return Err(format!("a fresh client's SELECT 1 went wrong: {seen:?}"));
    }
    Ok(())
}
