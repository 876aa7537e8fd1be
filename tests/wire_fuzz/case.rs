//! A fuzz case: the frontend messages one connection sends, in order, and how it ends. Seeds
//! (`seeds/*.seed`) and failing cases are written in the same text, one step per line, so a
//! failure can be read, edited and replayed (`SLUICE_WIRE_FUZZ_REPLAY=FILE`).
//!
//! ```text
//! startup user=fuzz database=fuzz       # StartupMessage (protocol 3.0), key=value pairs
//! scram                                 # the SCRAM-SHA-256 exchange, answering the server's
//!                                       # nonce (`scram bad-proof` / `scram cut` spoil it)
//! query SELECT 1                        # Query; the rest of the line is the text
//! parse NAME SQL | parse NAME types=23,25 SQL   # Parse (`-` is the unnamed statement)
//! bind PORTAL STMT [formats=0,1] [results=1] ARG…  # Bind: ARG is text, `null`, or `-` empty
//! describe S|P NAME, execute PORTAL MAXROWS, close S|P NAME
//! sync, flush, terminate, copydata TEXT, copydone, copyfail TEXT, password TEXT
//! sslrequest, gssencrequest, cancel own|other   # CancelRequest on a second connection
//! tls | tls cut | tls bent              # as a case's first steps: an SSLRequest and, if the
//!                                       # server says 'S', a real TLS handshake (the rest of
//!                                       # the case inside it), or its ClientHello cut short or
//!                                       # bent (the rest sent raw); later, an SSLRequest
//! raw HEX                               # bytes as they are (a mutated message)
//! await                                 # wait (≤ 1 s) for the answers to what was sent
//! sleep MS                              # pause
//! crowd N SQL                           # N other clients send SQL at once and go at random
//! end drop|read|halfclose               # how the case ends (default: read)
//! ```
//!
//! In texts `\n`, `\t`, `\\`, `\s` (a space) and `\xHH` are escapes.

use std::fmt::Write as _;

/// One thing the client does.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Startup(Vec<(String, String)>),
    Scram(ScramSpoil),
    Password(Vec<u8>),
    Query(Vec<u8>),
    Parse {
        name: String,
        types: Vec<u32>,
        sql: Vec<u8>,
    },
    Bind {
        portal: String,
        statement: String,
        formats: Vec<i16>,
        results: Vec<i16>,
        args: Vec<Option<Vec<u8>>>,
    },
    Describe(u8, String),
    Execute(String, i32),
    Close(u8, String),
    Sync,
    Flush,
    Terminate,
    CopyData(Vec<u8>),
    CopyDone,
    CopyFail(Vec<u8>),
    SslRequest,
    GssEncRequest,
    /// TLS asked for and, when the server accepts, negotiated (see [`TlsWay`]). Only a case's
    /// leading steps negotiate: anywhere else this is a plain SSLRequest.
    Tls(TlsWay),
    Cancel(CancelTarget),
    Raw(Vec<u8>),
    Await,
    Sleep(u64),
    /// Other clients at once: this many fresh connections log in and send this Query, then
    /// each goes at a random moment (dropped, cancelled, or after its answer) — statements
    /// queued and dropped while others hold the slots.
    Crowd(usize, Vec<u8>),
}

/// How a SCRAM exchange is spoiled (or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScramSpoil {
    None,
    /// A proof computed from the wrong password.
    BadProof,
    /// The client-final message cut in half.
    Cut,
}

/// What the client does after the server accepts TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsWay {
    /// A real handshake; the case's later steps are sent inside TLS.
    Handshake,
    /// The ClientHello cut short (then the later steps, raw).
    Cut,
    /// The ClientHello with bytes changed (then the later steps, raw).
    Bent,
}

/// Whose statement a CancelRequest names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelTarget {
    /// This connection's (from its BackendKeyData).
    Own,
    /// A made-up key.
    Other,
}

/// How the connection ends once the steps are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Closed at once, whatever is in flight.
    Drop,
    /// After the answers to what was sent (≤ 1 s).
    Read,
    /// The write half shut, then read until the server closes (≤ 1 s).
    HalfClose,
}

/// A whole case.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub steps: Vec<Step>,
    pub ending: Ending,
    /// Each message written in random pieces, with pauses between.
    pub chunked: bool,
}

/// A tagged message: type byte, length, body.
pub fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(tag);
    out.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn cstr(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(s);
    out.push(0);
}

/// An untagged message (startup, SSL/GSS/cancel requests): length, then code and body.
pub fn untagged(code: i32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as i32 + 8).to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(body);
    out
}

pub const PROTOCOL_3: i32 = 196608;
pub const SSL_REQUEST: i32 = 80877103;
pub const GSSENC_REQUEST: i32 = 80877104;
pub const CANCEL_REQUEST: i32 = 80877102;

/// How many SSLRequests and GSSENCRequests `bytes` may hold (their answer is one byte, not
/// a message), wherever a mutation put them and whatever length it gave them: each
/// occurrence of their codes counts.
pub fn single_byte_requests(bytes: &[u8]) -> usize {
    [SSL_REQUEST, GSSENC_REQUEST]
        .iter()
        .map(|code| {
            let code = code.to_be_bytes();
            bytes.windows(4).filter(|w| *w == code.as_slice()).count()
        })
        .sum()
}

impl Step {
    /// The bytes this step writes, for the steps that are plain messages (None for the ones
    /// the runner carries out: SCRAM, cancel, await, sleep).
    pub fn bytes(&self) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        Some(match self {
            Step::Startup(params) => {
                for (k, v) in params {
                    cstr(&mut body, k.as_bytes());
                    cstr(&mut body, v.as_bytes());
                }
                body.push(0);
                untagged(PROTOCOL_3, &body)
            }
            Step::Password(text) => {
                cstr(&mut body, text);
                frame(b'p', &body)
            }
            Step::Query(sql) => {
                cstr(&mut body, sql);
                frame(b'Q', &body)
            }
            Step::Parse { name, types, sql } => {
                cstr(&mut body, name.as_bytes());
                cstr(&mut body, sql);
                body.extend_from_slice(&(types.len() as i16).to_be_bytes());
                for t in types {
                    body.extend_from_slice(&t.to_be_bytes());
                }
                frame(b'P', &body)
            }
            Step::Bind {
                portal,
                statement,
                formats,
                results,
                args,
            } => {
                cstr(&mut body, portal.as_bytes());
                cstr(&mut body, statement.as_bytes());
                body.extend_from_slice(&(formats.len() as i16).to_be_bytes());
                for f in formats {
                    body.extend_from_slice(&f.to_be_bytes());
                }
                body.extend_from_slice(&(args.len() as i16).to_be_bytes());
                for a in args {
                    match a {
                        None => body.extend_from_slice(&(-1i32).to_be_bytes()),
                        Some(v) => {
                            body.extend_from_slice(&(v.len() as i32).to_be_bytes());
                            body.extend_from_slice(v);
                        }
                    }
                }
                body.extend_from_slice(&(results.len() as i16).to_be_bytes());
                for f in results {
                    body.extend_from_slice(&f.to_be_bytes());
                }
                frame(b'B', &body)
            }
            Step::Describe(kind, name) | Step::Close(kind, name) => {
                body.push(*kind);
                cstr(&mut body, name.as_bytes());
                frame(
                    if matches!(self, Step::Describe(..)) {
                        b'D'
                    } else {
                        b'C'
                    },
                    &body,
                )
            }
            Step::Execute(portal, max_rows) => {
                cstr(&mut body, portal.as_bytes());
                body.extend_from_slice(&max_rows.to_be_bytes());
                frame(b'E', &body)
            }
            Step::Sync => frame(b'S', &[]),
            Step::Flush => frame(b'H', &[]),
            Step::Terminate => frame(b'X', &[]),
            Step::CopyData(data) => frame(b'd', data),
            Step::CopyDone => frame(b'c', &[]),
            Step::CopyFail(text) => {
                cstr(&mut body, text);
                frame(b'f', &body)
            }
            Step::SslRequest | Step::Tls(_) => untagged(SSL_REQUEST, &[]),
            Step::GssEncRequest => untagged(GSSENC_REQUEST, &[]),
            Step::Raw(bytes) => bytes.clone(),
            Step::Scram(_) | Step::Cancel(_) | Step::Await | Step::Sleep(_) | Step::Crowd(..) => {
                return None
            }
        })
    }

    /// Whether the server answers this step with a ReadyForQuery (when all is well).
    pub fn expects_ready(&self) -> bool {
        match self {
            Step::Query(_) | Step::Sync => true,
            Step::Raw(bytes) => matches!(bytes.first(), Some(b'Q' | b'S')),
            _ => false,
        }
    }
}

/// Decodes the escapes of a seed's text.
fn unescape(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        match bytes.get(i + 1) {
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            Some(b's') => out.push(b' '),
            Some(b'\\') => out.push(b'\\'),
            Some(b'x') => {
                let hex = text.get(i + 2..i + 4).ok_or("\\x needs two hex digits")?;
                out.push(u8::from_str_radix(hex, 16).map_err(|e| format!("\\x{hex}: {e}"))?);
                i += 2;
            }
            other => return Err(format!("unknown escape \\{:?}", other.map(|b| *b as char))),
        }
        i += 2;
    }
    Ok(out)
}

/// Writes bytes with the escapes `unescape` reads (`space` escaped too when it separates
/// words).
fn escape(out: &mut String, bytes: &[u8], space: bool) {
    for &b in bytes {
        match b {
            b'\n' => out.push_str("\\n"),
            b'\t' => out.push_str("\\t"),
            b'\\' => out.push_str("\\\\"),
            b' ' if space => out.push_str("\\s"),
            0x21..=0x7e | b' ' => out.push(b as char),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
}

fn name(word: &str) -> Result<String, String> {
    let bytes = unescape(word)?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{word}: not UTF-8"))?;
    Ok(if text == "-" { String::new() } else { text })
}

fn kind(word: &str) -> Result<u8, String> {
    match word {
        "S" => Ok(b'S'),
        "P" => Ok(b'P'),
        other => unescape(other)?
            .first()
            .copied()
            .ok_or_else(|| "describe/close needs S or P".into()),
    }
}

fn list<T: std::str::FromStr>(text: &str) -> Result<Vec<T>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|n| n.parse().map_err(|_| format!("{n}: not a number")))
        .collect()
}

fn hex(text: &str) -> Result<Vec<u8>, String> {
    let text: String = text.split_whitespace().collect();
    if text.len() % 2 != 0 {
        return Err("odd number of hex digits".into());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

impl Case {
    /// Reads a case from its text.
    pub fn parse(text: &str) -> Result<Case, String> {
        let mut case = Case {
            steps: Vec::new(),
            ending: Ending::Read,
            chunked: false,
        };
        for (number, line) in text.lines().enumerate() {
            let line = line.trim_start();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
            let step = Case::step(word, rest).map_err(|e| format!("line {}: {e}", number + 1))?;
            match step {
                Some(step) => case.steps.push(step),
                None if word == "end" => {
                    case.ending = match rest.trim() {
                        "drop" => Ending::Drop,
                        "read" => Ending::Read,
                        "halfclose" => Ending::HalfClose,
                        other => return Err(format!("line {}: end {other}?", number + 1)),
                    }
                }
                None => case.chunked = true,
            }
        }
        Ok(case)
    }

    fn step(word: &str, rest: &str) -> Result<Option<Step>, String> {
        let words = || rest.split_whitespace();
        let arg = |i: usize| {
            words()
                .nth(i)
                .ok_or_else(|| format!("{word}: argument {i}?"))
        };
        Ok(Some(match word {
            "startup" => Step::Startup(
                words()
                    .map(|pair| {
                        let (k, v) = pair.split_once('=').ok_or("key=value")?;
                        Ok((name(k)?, name(v)?))
                    })
                    .collect::<Result<_, String>>()?,
            ),
            "scram" => Step::Scram(match rest.trim() {
                "" => ScramSpoil::None,
                "bad-proof" => ScramSpoil::BadProof,
                "cut" => ScramSpoil::Cut,
                other => return Err(format!("scram {other}?")),
            }),
            "password" => Step::Password(unescape(rest)?),
            "query" => Step::Query(unescape(rest)?),
            "parse" => {
                let (statement, sql) = rest.split_once(' ').unwrap_or((rest, ""));
                let (types, sql) = match sql.strip_prefix("types=") {
                    Some(after) => {
                        let (types, sql) = after.split_once(' ').unwrap_or((after, ""));
                        (list(types)?, sql)
                    }
                    None => (Vec::new(), sql),
                };
                Step::Parse {
                    name: name(statement)?,
                    types,
                    sql: unescape(sql)?,
                }
            }
            "bind" => {
                let mut formats = Vec::new();
                let mut results = Vec::new();
                let mut args = Vec::new();
                for w in words().skip(2) {
                    if let Some(f) = w.strip_prefix("formats=") {
                        formats = list(f)?;
                    } else if let Some(f) = w.strip_prefix("results=") {
                        results = list(f)?;
                    } else if w == "null" {
                        args.push(None);
                    } else if w == "-" {
                        args.push(Some(Vec::new()));
                    } else {
                        args.push(Some(unescape(w)?));
                    }
                }
                Step::Bind {
                    portal: name(arg(0)?)?,
                    statement: name(arg(1)?)?,
                    formats,
                    results,
                    args,
                }
            }
            "describe" => Step::Describe(kind(arg(0)?)?, name(words().nth(1).unwrap_or("-"))?),
            "close" => Step::Close(kind(arg(0)?)?, name(words().nth(1).unwrap_or("-"))?),
            "execute" => Step::Execute(
                name(arg(0)?)?,
                words()
                    .nth(1)
                    .unwrap_or("0")
                    .parse()
                    .map_err(|_| "execute PORTAL MAXROWS")?,
            ),
            "sync" => Step::Sync,
            "flush" => Step::Flush,
            "terminate" => Step::Terminate,
            "copydata" => Step::CopyData(unescape(rest)?),
            "copydone" => Step::CopyDone,
            "copyfail" => Step::CopyFail(unescape(rest)?),
            "sslrequest" => Step::SslRequest,
            "tls" => Step::Tls(match rest.trim() {
                "" => TlsWay::Handshake,
                "cut" => TlsWay::Cut,
                "bent" => TlsWay::Bent,
                other => return Err(format!("tls {other}?")),
            }),
            "gssencrequest" => Step::GssEncRequest,
            "cancel" => Step::Cancel(match rest.trim() {
                "own" => CancelTarget::Own,
                "other" => CancelTarget::Other,
                other => return Err(format!("cancel {other}?")),
            }),
            "raw" => Step::Raw(hex(rest)?),
            "await" => Step::Await,
            "sleep" => Step::Sleep(rest.trim().parse().map_err(|_| "sleep MS")?),
            "crowd" => {
                let (n, sql) = rest.split_once(' ').ok_or("crowd N SQL")?;
                Step::Crowd(n.parse().map_err(|_| "crowd N SQL")?, unescape(sql)?)
            }
            "end" => return Ok(None),
            "chunked" => return Ok(None),
            other => return Err(format!("unknown step {other:?}")),
        }))
    }

    /// The case as text `parse` reads back.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if self.chunked {
            out.push_str("chunked\n");
        }
        for step in &self.steps {
            match step {
                Step::Startup(params) => {
                    out.push_str("startup");
                    for (k, v) in params {
                        out.push(' ');
                        escape(&mut out, k.as_bytes(), true);
                        out.push('=');
                        escape(&mut out, v.as_bytes(), true);
                    }
                }
                Step::Scram(spoil) => out.push_str(match spoil {
                    ScramSpoil::None => "scram",
                    ScramSpoil::BadProof => "scram bad-proof",
                    ScramSpoil::Cut => "scram cut",
                }),
                Step::Tls(way) => out.push_str(match way {
                    TlsWay::Handshake => "tls",
                    TlsWay::Cut => "tls cut",
                    TlsWay::Bent => "tls bent",
                }),
                Step::Cancel(CancelTarget::Own) => out.push_str("cancel own"),
                Step::Cancel(CancelTarget::Other) => out.push_str("cancel other"),
                Step::Await => out.push_str("await"),
                Step::Sleep(ms) => {
                    let _ = write!(out, "sleep {ms}");
                }
                Step::Crowd(n, sql) => {
                    let _ = write!(out, "crowd {n} ");
                    escape(&mut out, sql, false);
                }
                // Every other step as the bytes it writes: exact, whatever a mutation did.
                other => {
                    out.push_str("raw ");
                    for b in other.bytes().unwrap_or_default() {
                        let _ = write!(out, "{b:02x}");
                    }
                }
            }
            out.push('\n');
        }
        out.push_str(match self.ending {
            Ending::Drop => "end drop\n",
            Ending::Read => "end read\n",
            Ending::HalfClose => "end halfclose\n",
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_reads_back_from_its_text() {
        let case = Case::parse(
            "tls cut\nstartup user=fuzz database=x\\sy\nscram\nquery SELECT\\s'a\\x00'\nparse s types=23 SELECT $1\n\
             bind - s formats=0 null - 7\nexecute - 5\nsync\nawait\nsleep 3\ncancel own\nend drop\n",
        )
        .expect("parses");
        assert_eq!(case.steps.len(), 11);
        assert_eq!(case.ending, Ending::Drop);
        let again = Case::parse(&case.text()).expect("reads back");
        let bytes = |c: &Case| c.steps.iter().map(Step::bytes).collect::<Vec<_>>();
        assert_eq!(bytes(&again), bytes(&case));
        assert_eq!(again.ending, case.ending);
        assert_eq!(again.steps[0], Step::Tls(TlsWay::Cut));
    }
}
