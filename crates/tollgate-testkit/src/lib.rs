//! Test helpers shared by the server, CLI and client tests, so that each suite
//! does not carry its own copy: the real `tollgate` binary started on port 0
//! ([`ServeProcess`]), with a clean environment ([`clean_command`]), built
//! once per test process when a suite lives outside the binary's package
//! ([`tollgate_binary`]); and the assertion on Tollgate's typed error bodies
//! ([`assert_error`]).
//!
//! A webhook [`receiver::Receiver`] on loopback records deliveries and checks
//! their signatures with its own HMAC.
//!
//! An [`Api`] is the request vocabulary the handler and end-to-end suites
//! share: each says only how one request travels.
//!
//! A [`browser::Browser`] drives a headless Chromium over the W3C WebDriver
//! protocol, for the tests of the server's HTML pages.
//!
//! This crate is a dev-dependency only; nothing that ships depends on it.

mod api;
pub mod browser;
pub mod receiver;

pub use api::{Api, As, STRANGER_TOKEN, outcomes, usage_event};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// The bound on waiting for a server to print its listening line or to stop.
/// It only keeps a broken build from hanging a suite; passing tests never come
/// near it.
pub const PROCESS_WAIT_MAX: Duration = Duration::from_secs(120);

/// The `tollgate` binary, built once per test process with `cargo build -p
/// tollgate`, for suites outside the binary's package (inside it, Cargo's
/// `CARGO_BIN_EXE_tollgate` names it). A test never runs a binary older than
/// the sources; when it is already fresh the build is a quick no-op.
pub fn tollgate_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        // A test executable lives in <target>/<profile dir>/deps; the binary
        // is built into <target>/<profile dir> beside it, in the same profile.
        let test_exe = std::env::current_exe().expect("the test executable has a path");
        let profile_dir = test_exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<exe>");
        let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
            Some("debug") | None => "dev".to_owned(),
            Some(name) => name.to_owned(),
        };
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = std::process::Command::new(cargo)
            .current_dir(&workspace)
            .args(["build", "--quiet", "--profile", &profile, "-p", "tollgate", "--bin", "tollgate"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build -p tollgate failed");
        let binary = profile_dir.join("tollgate");
        assert!(binary.is_file(), "no tollgate binary at {}", binary.display());
        binary
    })
}

/// A command for `binary` with no inherited configuration: every `TOLLGATE_*`
/// variable and `DATABASE_URL` (which `scripts/with-postgres` exports) are
/// removed, so each test states exactly what it configures. Logs at `warn`,
/// no stdin, killed when dropped.
pub fn clean_command(binary: &Path) -> Command {
    let mut command = Command::new(binary);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("TOLLGATE_") || n == "DATABASE_URL") {
            command.env_remove(&name);
        }
    }
    command.env("TOLLGATE_LOG", "warn");
    command.stdin(Stdio::null()).kill_on_drop(true);
    command
}

/// Where a started server's stderr goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stderr {
    /// Read as it is written and handed back by [`ServeProcess::terminate`].
    Capture,
    /// The test's own stderr, for suites that only need it when a test fails.
    Inherit,
}

/// Why a server did not start: its exit status and what it wrote on stderr.
#[derive(Debug)]
pub struct StartFailure {
    pub status: String,
    pub stderr: String,
}

/// A running `tollgate serve`, killed when dropped.
pub struct ServeProcess {
    child: Child,
    /// Everything the server wrote on stderr, drained as it is written: a
    /// pipe nobody reads fills up, and a server logging into it then blocks.
    stderr: Option<JoinHandle<String>>,
    /// `http://host:port`, as the server printed it.
    pub base: String,
    /// What the server printed on stdout up to and including its listening line.
    pub banner: Vec<String>,
}

impl ServeProcess {
    /// Spawns `command` (a `serve` command line) and waits until it prints
    /// `listening on URL`. A server that exits first is a [`StartFailure`].
    pub async fn start(mut command: Command, stderr: Stderr) -> Result<ServeProcess, StartFailure> {
        command.stdout(Stdio::piped());
        command.stderr(match stderr {
            Stderr::Capture => Stdio::piped(),
            Stderr::Inherit => Stdio::inherit(),
        });
        let mut child = command.spawn().expect("the tollgate binary starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr = child.stderr.take();
        let mut lines = BufReader::new(stdout).lines();
        let mut banner = Vec::new();
        let listening = tokio::time::timeout(PROCESS_WAIT_MAX, async {
            while let Ok(Some(line)) = lines.next_line().await {
                banner.push(line.clone());
                if let Some(address) = line.strip_prefix("listening on ") {
                    return Some(address.to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let Some(base) = listening else {
            let status = match tokio::time::timeout(PROCESS_WAIT_MAX, child.wait()).await {
                Ok(Ok(status)) => status.to_string(),
                _ => "no exit".to_owned(),
            };
            let mut text = String::new();
            if let Some(stderr) = stderr.as_mut() {
                let _ = stderr.read_to_string(&mut text).await;
            }
            return Err(StartFailure { status, stderr: text });
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let stderr = stderr.map(|mut stderr| {
            tokio::spawn(async move {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text).await;
                text
            })
        });
        Ok(ServeProcess { child, stderr, base, banner })
    }

    /// The address the server listens on.
    pub fn address(&self) -> SocketAddr {
        let authority = self.base.strip_prefix("http://").unwrap_or(&self.base);
        authority.parse().expect("the printed address parses")
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server is running")
    }

    /// SIGKILL, as a crash would: no graceful shutdown, requests in flight are
    /// cut off. Returns once the process is gone.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("the server can be killed");
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it
    /// exited successfully, and its stderr when it was captured.
    pub async fn terminate(mut self) -> (bool, String) {
        let pid = self.pid();
        let sent = signal("TERM", pid);
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        let status = tokio::time::timeout(PROCESS_WAIT_MAX, self.child.wait())
            .await
            .expect("the server stops after SIGTERM")
            .expect("the server's exit status");
        let text = match self.stderr.take() {
            Some(stderr) => stderr.await.unwrap_or_default(),
            None => String::new(),
        };
        (status.success(), text)
    }
}

/// Sends `signal` to the process `pid` with kill(1). The pid is always a
/// positive process id, never a group, and follows `--`: procps' kill reads an
/// argument like `-12345` before `--` as the option `-1`, which means every
/// process on the machine.
pub fn signal(signal: &str, pid: u32) -> std::io::Result<std::process::ExitStatus> {
    assert!(pid > 1, "refusing to signal pid {pid}");
    std::process::Command::new("kill").args(["-s", signal, "--", &pid.to_string()]).status()
}

/// Sends `GET /healthz` on a kept-alive connection and returns the response's
/// status line, having read exactly the response (head and body), so that the
/// connection is ready for the next request: the connection-bound tests ask
/// whether the server still serves a connection, not only whether it is open.
pub async fn healthz(stream: &mut TcpStream) -> std::io::Result<String> {
    stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n").await?;
    let mut received = Vec::new();
    let head_end = loop {
        if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        received.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(received[..head_end].to_vec()).expect("an ASCII response head");
    let length: usize = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .expect("the response has a content-length");
    let mut body_len = received.len() - head_end;
    while body_len < length {
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await?;
        assert!(n > 0, "the response ended early: {head}");
        body_len += n;
    }
    Ok(head.lines().next().unwrap_or_default().to_owned())
}

/// A response body as the suites compare it: JSON when it parses, `Null`
/// when empty, else the text as a JSON string.
pub fn body_value(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
    }
}

/// Asserts a Tollgate error answer: its status, stable code and `retryable`,
/// and that it explains itself with a message.
pub fn assert_error(actual: (StatusCode, Value), status: StatusCode, code: &str, retryable: bool) {
    let (actual_status, body) = actual;
    assert_eq!(actual_status, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["retryable"], retryable, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_read_as_json_null_or_text() {
        assert_eq!(body_value(b""), Value::Null);
        assert_eq!(body_value(br#"{"a":1}"#), serde_json::json!({"a": 1}));
        assert_eq!(body_value(b"<html>"), Value::String("<html>".into()));
    }

    #[test]
    #[should_panic(expected = "refusing to signal pid 1")]
    fn signal_never_targets_init_or_a_group() {
        let _ = signal("TERM", 1);
    }
}
