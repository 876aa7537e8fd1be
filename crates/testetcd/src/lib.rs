//! A real etcd for tests: a cluster of `size` members of the machine's `etcd` binary (Debian's
//! `etcd-server`), each on free loopback ports with its data in a directory the test owns,
//! killed (SIGKILL) when dropped. Members can be killed and started again to try what a fleet
//! does when etcd loses a member or its quorum.
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
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<Child>,
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Etcd {
    /// Starts a cluster of `size` members under `dir` and waits until every member is healthy.
    pub fn start(dir: &Path, size: usize) -> Etcd {
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                process: None,
            })
            .collect();
        let mut etcd = Etcd {
            dir: dir.to_path_buf(),
            members,
        };
        for i in 0..size {
            etcd.spawn(i, "new");
        }
        for i in 0..size {
            etcd.wait_healthy(i);
        }
        etcd
    }

    /// The client URLs of every member (`http://127.0.0.1:PORT`), killed ones too.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
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
        let port = self.members[i].client_port;
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
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let process = Command::new("etcd")
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
