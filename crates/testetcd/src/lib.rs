//! A real etcd for tests: a cluster of `size` members of the machine's `etcd` binary (Debian's
//! `etcd-server`), each on free loopback ports with its data in a directory the test owns,
//! killed (SIGKILL) when dropped. Members can be killed and started again to try what a fleet
//! does when etcd loses a member or its quorum.
//!
//! [`Etcd::start_tls`] serves clients over TLS only, asking each for a certificate signed by
//! its CA (files made with the machine's `openssl`: [`Tls`]).
//!
//! Only a dev-dependency: nothing here ships in the binary.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd cluster.
#[derive(Debug)]
pub struct Etcd {
    dir: PathBuf,
    members: Vec<Member>,
    tls: Option<Tls>,
}

/// The PEM files of a TLS cluster: its CA, etcd's certificate, and a client's.
#[derive(Debug, Clone)]
pub struct Tls {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain HTTP `/health`, whether clients speak TLS or not.
    metrics_port: u16,
    process: Option<Child>,
}

/// A loopback port nobody listens on now, below the range the kernel gives outgoing
/// connections their ports from (`net.ipv4.ip_local_port_range`, 32768–60999 by default). A
/// port from that range (a bind to port 0) could be taken, before its member binds it, by
/// another member's connection to its peers: etcd then exits with "address already in use"
/// (seen once in CI). Ports are handed out in turn from a random start, so that no two of one
/// test process are the same (a cluster's ports are all picked before any member binds one).
fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let outgoing_from: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let below = outgoing_from.saturating_sub(12_000).max(1_024);
    let span = u64::from(outgoing_from.saturating_sub(below).max(1));
    let start = *START.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.finish() % span
    });
    loop {
        let turn = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = below + ((start + turn) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

impl Etcd {
    /// Starts a cluster of `size` members under `dir` and waits until every member is healthy.
    pub fn start(dir: &Path, size: usize) -> Etcd {
        Etcd::start_with(dir, size, None)
    }

    /// [`Etcd::start`], serving clients over TLS only and asking each for a certificate its CA
    /// signed ([`Etcd::tls`] has the files).
    pub fn start_tls(dir: &Path, size: usize) -> Etcd {
        let tls = Tls::make(dir);
        Etcd::start_with(dir, size, Some(tls))
    }

    fn start_with(dir: &Path, size: usize, tls: Option<Tls>) -> Etcd {
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                metrics_port: free_port(),
                process: None,
            })
            .collect();
        let mut etcd = Etcd {
            dir: dir.to_path_buf(),
            members,
            tls,
        };
        for i in 0..size {
            etcd.spawn(i, "new");
        }
        for i in 0..size {
            etcd.wait_healthy(i);
        }
        etcd
    }

    /// The client URLs of every member (`http://127.0.0.1:PORT`, `https://` with TLS), killed
    /// ones too.
    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The TLS files of a cluster started with [`Etcd::start_tls`].
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    /// Kills member `i` at once (SIGKILL), as a crash would.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut process) = self.members[i].process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// Starts member `i` again after [`Etcd::kill`], on its data and ports; returns without
    /// waiting for it to be healthy (it cannot be while the cluster has no quorum).
    pub fn restart(&mut self, i: usize) {
        self.spawn(i, "existing");
    }

    /// Waits until member `i` answers `/health` with `true` (a minute at most).
    pub fn wait_healthy(&self, i: usize) {
        let port = self.members[i].metrics_port;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if healthy(port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(self.dir.join(format!("{}.log", self.members[i].name)))
            .unwrap_or_default();
        panic!("etcd member {i} not healthy within a minute; its log:\n{log}");
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let member = &self.members[i];
        let log = std::fs::File::create(self.dir.join(format!("{}.log", member.name)))
            .expect("etcd's log file");
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let metrics = format!("http://127.0.0.1:{}", member.metrics_port);
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let process = command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(self.dir.join(&member.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &cluster.join(",")])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "sluice-test"])
            .args(["--listen-metrics-urls", &metrics])
            // Fast elections on loopback, so a lost member is replaced in well under a second.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("etcd (Debian's etcd-server) on PATH");
        self.members[i].process = Some(process);
    }
}

impl Tls {
    /// A CA, a certificate for etcd on 127.0.0.1 and a client's, all signed by the CA, in `dir`.
    fn make(dir: &Path) -> Tls {
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .current_dir(dir)
                .args(args)
                .output()
                .expect("openssl runs");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=sluice-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ]);
        for (name, ext) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            let (key, csr, crt, extfile) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            openssl(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &key,
                "-out",
                &csr,
            ]);
            std::fs::write(dir.join(&extfile), ext).expect("ext");
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                &extfile,
                "-out",
                &crt,
            ]);
        }
        Tls {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        }
    }
}

/// Whether the etcd member on `port` says it is healthy (`GET /health`).
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
