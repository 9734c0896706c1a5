//! `serve` applies `server.*_timeout_seconds`: a silent connection is closed at the
//! configured idle timeout (the gateway's tests cover each timeout in detail).

use std::io::Read;
use std::time::{Duration, Instant};

use crate::cli::start_serve_with_env;
use crate::client::KillOnDrop;

#[test]
fn serve_closes_a_silent_connection_at_the_configured_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (child, address, lines) = start_serve_with_env(
        dir.path(),
        &[],
        &[("SUBFLOW__SERVER__IDLE_TIMEOUT_SECONDS", "1")],
    );
    let _serve = KillOnDrop(child);
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    let mut silent = std::net::TcpStream::connect(&address).unwrap();
    // Only a bound on a hang: the default idle timeout is 60 s.
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let started = Instant::now();
    let mut received = Vec::new();
    silent
        .read_to_end(&mut received)
        .expect("closed by serve, not by the read timeout");
    println!(
        "serve closed a silent connection after {:?}",
        started.elapsed()
    );
    assert!(received.is_empty());
}
