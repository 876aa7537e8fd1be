//! Making cases: a seed taken at random and changed a few times — steps dropped, repeated,
//! swapped, spliced from another seed or made up; SQL texts and numbers bent; a message's
//! bytes flipped, its length field lied about, cut short or padded; the connection cut after
//! any step.

use crate::case::{CancelTarget, Case, Ending, ScramSpoil, Step, TlsWay};

/// A small deterministic generator (SplitMix64): a case is reproduced from the run's seed and
/// its number.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True one time in `n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Pieces put into SQL texts: quoting, parameters, comments, sluice's settings, unknown
/// workloads, slow and large statements, invalid UTF-8.
const SQL_PIECES: &[&str] = &[
    "'",
    "\"",
    "$1",
    "$2",
    ";",
    "; SELECT 2",
    "--",
    "/*",
    "*/",
    "(",
    ")",
    ",",
    "\0",
    "\u{e9}",
    "\u{1f600}",
    " SETTINGS workload = 'fuzz_fast'",
    " SETTINGS workload = 'fuzz_slow'",
    " SETTINGS workload = 'no_such_workload'",
    " SETTINGS max_execution_time = 0.2",
    " SETTINGS workload_admission_timeout_ms = 1",
    " FROM system.processes",
    " FROM system.scheduler",
    " pg_sleep(0.05)",
    " generate_series(1, 100000)",
    " clusterAllReplicas('default', system.processes)",
    "KILL QUERY WHERE 1",
    "SET workload = 'fuzz_slow'",
    "BEGIN",
    "ROLLBACK",
    "COPY (SELECT 1) TO STDOUT",
    "COPY sink FROM STDIN",
    "CREATE WORKLOAD w IN all",
    "DROP WORKLOAD fuzz",
    "\\x",
    "E'\\\\",
    "::int",
    "::text[]",
    "NULL",
];

const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1e308",
    "NaN",
    "2147483648",
    "99999999999999999999999999",
    "-9223372036854775808",
    "0.0000001",
];

const INTS: &[i32] = &[
    0,
    1,
    -1,
    2,
    3,
    4,
    5,
    8,
    255,
    65535,
    i32::MAX,
    i32::MIN,
    1 << 30,
    1 << 24,
];

/// A step made up from nothing.
fn made_up(rng: &mut Rng) -> Step {
    let sql = |rng: &mut Rng| {
        let mut text = rng
            .pick(&[
                "SELECT 1",
                "SELECT $1",
                "SELECT * FROM system.scheduler",
                "",
            ])
            .to_string();
        let piece: &&str = rng.pick(SQL_PIECES);
        text.push_str(piece);
        text.into_bytes()
    };
    match rng.below(16) {
        0 => Step::Query(sql(rng)),
        1 => Step::Parse {
            name: rng.pick(&["", "s1", "s2"]).to_string(),
            types: if rng.one_in(2) {
                Vec::new()
            } else {
                vec![*rng.pick(&[0u32, 23, 25, 16, 1700, 999_999])]
            },
            sql: sql(rng),
        },
        2 => Step::Bind {
            portal: rng.pick(&["", "p1"]).to_string(),
            statement: rng.pick(&["", "s1", "s2"]).to_string(),
            formats: (0..rng.below(3))
                .map(|_| *rng.pick(&[0i16, 1, 2, -1]))
                .collect(),
            results: (0..rng.below(3))
                .map(|_| *rng.pick(&[0i16, 1, 7]))
                .collect(),
            args: (0..rng.below(3))
                .map(|_| match rng.below(3) {
                    0 => None,
                    1 => Some(b"1".to_vec()),
                    _ => Some(vec![0xff; rng.below(9)]),
                })
                .collect(),
        },
        3 => Step::Describe(*rng.pick(b"SPX"), rng.pick(&["", "s1", "p1"]).to_string()),
        4 => Step::Execute(rng.pick(&["", "p1"]).to_string(), *rng.pick(INTS)),
        5 => Step::Close(*rng.pick(b"SPX"), rng.pick(&["", "s1", "p1"]).to_string()),
        6 => Step::Sync,
        7 => Step::Flush,
        8 => Step::Terminate,
        9 => Step::CopyData(vec![b'x'; rng.below(64)]),
        10 => rng
            .pick(&[Step::CopyDone, Step::CopyFail(b"no".to_vec())])
            .clone(),
        11 => rng
            .pick(&[
                Step::SslRequest,
                Step::GssEncRequest,
                Step::Tls(TlsWay::Handshake),
            ])
            .clone(),
        12 => Step::Cancel(*rng.pick(&[CancelTarget::Own, CancelTarget::Other])),
        13 => Step::Password(sql(rng)),
        14 if rng.one_in(2) => Step::Sleep(rng.below(60) as u64),
        14 => Step::Crowd(1 + rng.below(8), sql(rng)),
        _ => Step::Await,
    }
}

/// Bends an SQL text: a piece put in, a span taken out, a number swapped, the text repeated,
/// nested deep or made huge.
fn bend_sql(sql: &mut Vec<u8>, rng: &mut Rng) {
    let at = rng.below(sql.len() + 1);
    match rng.below(8) {
        0 | 1 => {
            let piece = rng.pick(SQL_PIECES).as_bytes().to_vec();
            sql.splice(at..at, piece);
        }
        2 if !sql.is_empty() => {
            let end = (at + 1 + rng.below(8)).min(sql.len());
            sql.drain(at.min(end)..end);
        }
        3 => {
            if let Some(digit) = sql.iter().position(|b| b.is_ascii_digit()) {
                let end = sql[digit..]
                    .iter()
                    .position(|b| !b.is_ascii_digit())
                    .map_or(sql.len(), |n| digit + n);
                sql.splice(digit..end, rng.pick(NUMBERS).bytes());
            }
        }
        4 if sql.len() < 64 * 1024 => {
            let copy = sql.clone();
            for _ in 0..1 + rng.below(20) {
                sql.push(b';');
                sql.extend_from_slice(&copy);
            }
        }
        5 => {
            // Deep nesting: the parsers' and planners' recursion.
            let depth = *rng.pick(&[100usize, 1000, 10_000, 100_000]);
            *sql = format!("SELECT {}1{}", "(".repeat(depth), ")".repeat(depth)).into_bytes();
        }
        6 => {
            // Huge: a long literal or a long list.
            let n = *rng.pick(&[10_000usize, 1 << 20, 8 << 20]);
            *sql = if rng.one_in(2) {
                format!("SELECT '{}'", "x".repeat(n)).into_bytes()
            } else {
                format!("SELECT 1{}", ",1".repeat(n / 2)).into_bytes()
            };
        }
        _ => {
            let byte = rng.next() as u8;
            sql.insert(at, byte);
        }
    }
}

/// Bends a message's bytes: a byte flipped, the length field set to a lie, cut short, padded,
/// or sent twice.
pub fn bend_bytes(bytes: &mut Vec<u8>, rng: &mut Rng) {
    if bytes.is_empty() {
        bytes.push(rng.next() as u8);
        return;
    }
    // Tagged messages carry their length at 1..5; untagged (startup, requests) at 0..4.
    let length_at = if bytes[0].is_ascii_alphabetic() { 1 } else { 0 };
    match rng.below(6) {
        0 => {
            let at = rng.below(bytes.len());
            bytes[at] ^= 1 << rng.below(8);
        }
        1 if bytes.len() >= length_at + 4 => {
            let real = (bytes.len() - length_at) as i32;
            let lie = match rng.below(3) {
                0 => *rng.pick(INTS),
                1 => real + 1,
                _ => real - 1,
            };
            bytes[length_at..length_at + 4].copy_from_slice(&lie.to_be_bytes());
        }
        2 => bytes.truncate(rng.below(bytes.len())),
        3 => {
            let at = rng.below(bytes.len() + 1);
            let pad: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
            bytes.splice(at..at, pad);
        }
        4 => {
            let copy = bytes.clone();
            bytes.extend_from_slice(&copy);
        }
        _ => {
            let at = rng.below(bytes.len());
            bytes[at] = rng.next() as u8;
        }
    }
}

/// A new case from the corpus.
pub fn case(corpus: &[Case], rng: &mut Rng) -> Case {
    let mut case = rng.pick(corpus).clone();
    for _ in 0..1 + rng.below(4) {
        let n = case.steps.len();
        let at = rng.below(n.max(1));
        match rng.below(12) {
            0 if n > 1 => {
                case.steps.remove(at);
            }
            1 if n > 0 => {
                let step = case.steps[at].clone();
                case.steps.insert(at, step);
            }
            2 if n > 1 => case.steps.swap(at, (at + 1) % n),
            3 => {
                // Splice: a run of another seed's steps put in here.
                let other = &rng.pick(corpus).steps;
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let to = (from + 1 + rng.below(4)).min(other.len());
                    let run = other[from..to].to_vec();
                    case.steps.splice(at..at, run);
                }
            }
            4 | 5 => case.steps.insert(at.min(n), made_up(rng)),
            6 | 7 => match case.steps.get_mut(at) {
                Some(Step::Query(sql))
                | Some(Step::Parse { sql, .. })
                | Some(Step::Crowd(_, sql)) => bend_sql(sql, rng),
                Some(Step::Execute(_, rows)) => *rows = *rng.pick(INTS),
                Some(Step::Scram(spoil)) => {
                    *spoil = *rng.pick(&[ScramSpoil::BadProof, ScramSpoil::Cut])
                }
                Some(Step::Tls(way)) => *way = *rng.pick(&[TlsWay::Cut, TlsWay::Bent]),
                Some(Step::Startup(params)) => match rng.below(3) {
                    0 if !params.is_empty() => {
                        params.remove(rng.below(params.len()));
                    }
                    1 => params.push((
                        rng.pick(&[
                            "options",
                            "workload",
                            "client_encoding",
                            "replication",
                            "application_name",
                            "database",
                            "user",
                        ])
                        .to_string(),
                        match rng.below(6) {
                            0 => "x".repeat(10_000),
                            _ => rng
                                .pick(&["-c workload=fuzz_slow", "LATIN1", "true", "", "fuzz"])
                                .to_string(),
                        },
                    )),
                    _ => params.push((String::new(), String::new())),
                },
                _ => {}
            },
            8 | 9 => {
                if let Some(step) = case.steps.get_mut(at) {
                    if let Some(mut bytes) = step.bytes() {
                        bend_bytes(&mut bytes, rng);
                        *step = Step::Raw(bytes);
                    }
                }
            }
            10 => case.steps.truncate(at + 1),
            _ => case
                .steps
                .insert(at.min(n), Step::Cancel(CancelTarget::Own)),
        }
    }
    case.ending = *rng.pick(&[Ending::Drop, Ending::Read, Ending::Read, Ending::HalfClose]);
    case.chunked = rng.one_in(5);
    // One case in four asks for TLS first: where the server offers it, the whole
    // conversation runs inside TLS (a server without it refuses and the case goes on).
    if rng.one_in(4) && !matches!(case.steps.first(), Some(Step::Tls(_))) {
        case.steps.insert(0, Step::Tls(TlsWay::Handshake));
    }
    case
}
