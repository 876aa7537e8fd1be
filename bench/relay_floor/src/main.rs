//! The floor under a forwarding proxy: a relay that passes bytes between each client and a
//! connection of its own to the upstream and does nothing else — no parsing, no admission, no
//! pooling — in three designs, so that their instructions and CPU per transaction can be put
//! beside PgBouncer's and sluice's (bench/relay_floor.sh):
//!
//! - `tokio`: tokio's current-thread runtime, a task per connection, `copy_bidirectional`
//!   (what sluice's connection thread is built on);
//! - `poll`: one thread that owns every socket and polls them with epoll (mio), no tasks, no
//!   wakers (the design PgBouncer's libevent loop stands for);
//! - `threads`: two blocking threads per connection, one per direction (the kernel schedules);
//! - `uring`: one thread that owns every socket and drives them through io_uring: a receive
//!   always outstanding on each socket, and what it brings sent on with the next receive
//!   linked behind it, so that a message relayed is one system call (`io_uring_enter`, which
//!   submits the send and the receive and sleeps until the next completion) where the
//!   others make three (a receive, a send, an `epoll_wait`).
//!
//! Usage: `relay-floor tokio|poll|threads|uring LISTEN_ADDR UPSTREAM_ADDR`.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, mode, listen, upstream] = args.as_slice() else {
        eprintln!("usage: relay-floor tokio|poll|threads|uring LISTEN_ADDR UPSTREAM_ADDR");
        std::process::exit(2);
    };
    let listen: SocketAddr = listen.parse().expect("a listen address");
    let upstream: SocketAddr = upstream.parse().expect("an upstream address");
    match mode.as_str() {
        "tokio" => with_tokio(listen, upstream),
        "poll" => with_poll(listen, upstream),
        "threads" => with_threads(listen, upstream),
        "uring" => with_uring(listen, upstream),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
}

fn with_tokio(listen: SocketAddr, upstream: SocketAddr) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        eprintln!("listening on {listen}");
        loop {
            let (mut client, _) = listener.accept().await?;
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    })
}

fn with_threads(listen: SocketAddr, upstream: SocketAddr) -> io::Result<()> {
    let listener = std::net::TcpListener::bind(listen)?;
    eprintln!("listening on {listen}");
    for client in listener.incoming() {
        let client = match client {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => other?,
        };
        let server = std::net::TcpStream::connect(upstream)?;
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let (mut c_read, mut s_write) = (client.try_clone()?, server.try_clone()?);
        let (mut s_read, mut c_write) = (server, client);
        std::thread::spawn(move || {
            let _ = io::copy(&mut c_read, &mut s_write);
            let _ = s_write.shutdown(std::net::Shutdown::Both);
        });
        std::thread::spawn(move || {
            let _ = io::copy(&mut s_read, &mut c_write);
            let _ = c_write.shutdown(std::net::Shutdown::Both);
        });
    }
    Ok(())
}

/// One side of a pair: its socket and what waits to be written to it.
struct Side {
    stream: mio::net::TcpStream,
    pending: Vec<u8>,
}

fn with_poll(listen: SocketAddr, upstream: SocketAddr) -> io::Result<()> {
    use mio::{Events, Interest, Poll, Token};
    // mio keeps Token(usize::MAX) for itself.
    const LISTENER: Token = Token(0);
    let mut poll = Poll::new()?;
    let mut listener = mio::net::TcpListener::bind(listen)?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    eprintln!("listening on {listen}");
    // Pair i: client at slot 2i, server at 2i + 1; a side's token is its slot + 1.
    let mut sides: Vec<Option<Side>> = Vec::new();
    let mut events = Events::with_capacity(256);
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        // Interrupted (valgrind's control reaches the process by a signal): poll again.
        match poll.poll(&mut events, None) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => other?,
        }
        for event in events.iter() {
            if event.token() == LISTENER {
                while let Ok((client, _)) = listener.accept() {
                    let server = std::net::TcpStream::connect(upstream)?;
                    server.set_nonblocking(true)?;
                    let server = mio::net::TcpStream::from_std(server);
                    client.set_nodelay(true)?;
                    server.set_nodelay(true)?;
                    let slot = sides.len();
                    for (i, mut stream) in [client, server].into_iter().enumerate() {
                        poll.registry().register(
                            &mut stream,
                            Token(slot + i + 1),
                            Interest::READABLE | Interest::WRITABLE,
                        )?;
                        sides.push(Some(Side {
                            stream,
                            pending: Vec::new(),
                        }));
                    }
                }
                continue;
            }
            let from = event.token().0 - 1;
            let to = from ^ 1;
            if sides[from].is_none() || sides[to].is_none() {
                continue;
            }
            let mut closed = false;
            if event.is_writable() {
                closed |= flush(sides[from].as_mut().expect("a side")).is_err();
            }
            if event.is_readable() {
                // Edge-triggered: read until the socket has nothing more.
                loop {
                    let side = sides[from].as_mut().expect("a side");
                    match side.stream.read(&mut buffer) {
                        Ok(0) => {
                            closed = true;
                            break;
                        }
                        Ok(n) => {
                            let other = sides[to].as_mut().expect("the other side");
                            other.pending.extend_from_slice(&buffer[..n]);
                            if flush(other).is_err() {
                                closed = true;
                                break;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            closed = true;
                            break;
                        }
                    }
                }
            }
            if closed {
                for slot in [from, to] {
                    if let Some(mut side) = sides[slot].take() {
                        let _ = poll.registry().deregister(&mut side.stream);
                    }
                }
            }
        }
    }
}

/// Writes what waits for `side` until it is all written or the socket is full.
fn flush(side: &mut Side) -> io::Result<()> {
    let mut written = 0;
    while written < side.pending.len() {
        match side.stream.write(&side.pending[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    side.pending.drain(..written);
    Ok(())
}

/// One socket of the `uring` relay and the buffer its receives fill (sent on from there).
struct Ring {
    stream: std::net::TcpStream,
    buffer: Box<[u8]>,
    /// The pair is going: this side is freed when its outstanding receive completes (the
    /// kernel may write to the buffer until then).
    closing: bool,
}

fn with_uring(listen: SocketAddr, upstream: SocketAddr) -> io::Result<()> {
    use io_uring::{opcode, squeue, types, IoUring};
    use std::os::fd::AsRawFd;
    const ACCEPT: u64 = u64::MAX;
    const BUFFER: usize = 64 * 1024;
    // A receive's user data is its side's slot << 1; a send's (posted only if it fails) the
    // slot whose buffer it sends << 1 | 1.
    let recv = |slot: usize, side: &mut Ring| {
        opcode::Recv::new(
            types::Fd(side.stream.as_raw_fd()),
            side.buffer.as_mut_ptr(),
            side.buffer.len() as u32,
        )
        .build()
        .user_data((slot as u64) << 1)
    };
    let listener = std::net::TcpListener::bind(listen)?;
    eprintln!("listening on {listen}");
    let mut ring = IoUring::new(1024)?;
    let accept = opcode::Accept::new(
        types::Fd(listener.as_raw_fd()),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    )
    .build()
    .user_data(ACCEPT);
    // Safety: every buffer an entry points at lives until its completion is read (a closing
    // side is kept until its receive completes).
    unsafe { ring.submission().push(&accept) }.expect("room for the accept");
    // Pair i: client at slot 2i, server at 2i + 1.
    let mut sides: Vec<Option<Ring>> = Vec::new();
    loop {
        // Submits what was queued and sleeps until something completes.
        match ring.submit_and_wait(1) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => other?,
        };
        let (_, mut submission, mut completion) = ring.split();
        completion.sync();
        for done in &mut completion {
            let (data, result) = (done.user_data(), done.result());
            if data == ACCEPT {
                let client = unsafe {
                    use std::os::fd::FromRawFd;
                    std::net::TcpStream::from_raw_fd(result)
                };
                unsafe { submission.push(&accept) }.expect("room for the accept");
                let server = std::net::TcpStream::connect(upstream)?;
                client.set_nodelay(true)?;
                server.set_nodelay(true)?;
                let slot = sides.len();
                for (i, stream) in [client, server].into_iter().enumerate() {
                    let mut side = Ring {
                        stream,
                        buffer: vec![0u8; BUFFER].into_boxed_slice(),
                        closing: false,
                    };
                    unsafe { submission.push(&recv(slot + i, &mut side)) }.expect("room");
                    sides.push(Some(side));
                }
                continue;
            }
            let from = (data >> 1) as usize;
            let to = from ^ 1;
            let is_send = data & 1 == 1;
            let closing = sides[from].as_ref().is_none_or(|s| s.closing);
            if !is_send && closing {
                // Its last receive is back: the buffer is the kernel's no more.
                sides[from] = None;
                continue;
            }
            if !is_send && result > 0 && sides[to].as_ref().is_some_and(|s| !s.closing) {
                let n = result as u32;
                let target = sides[to].as_ref().expect("the other side").stream.as_raw_fd();
                let side = sides[from].as_mut().expect("a side");
                let send = opcode::Send::new(types::Fd(target), side.buffer.as_ptr(), n)
                    .flags(libc::MSG_WAITALL)
                    .build()
                    .flags(squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS)
                    .user_data(((from as u64) << 1) | 1);
                let again = recv(from, side);
                unsafe {
                    submission.push(&send).expect("room for the send");
                    submission.push(&again).expect("room for the receive");
                }
                continue;
            }
            // End of stream, an error, or a failed send: the pair goes. Shutting both sockets
            // down makes their outstanding receives complete.
            for slot in [from, to] {
                if let Some(side) = sides[slot].as_mut() {
                    side.closing = true;
                    let _ = side.stream.shutdown(std::net::Shutdown::Both);
                }
            }
            if !is_send {
                sides[from] = None;
            }
        }
        submission.sync();
    }
}
