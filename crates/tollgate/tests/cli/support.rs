//! One helper for the end-to-end tests: the real `tollgate` binary, started on
//! port 0, and an HTTP client that talks to it.

use std::process::Stdio;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

pub const ADMIN: &str = "admin-token-for-end-to-end-tests";
pub const GATEWAY: &str = "gateway-token-for-end-to-end-tests";

/// The bound on waiting for a server to print its listening line or to stop.
/// It only keeps a broken build from hanging the suite; passing tests never
/// come near it.
pub const PROCESS_WAIT_MAX: Duration = Duration::from_secs(60);

/// A `tollgate` command with no inherited configuration: every `TOLLGATE_*`
/// variable and `DATABASE_URL` (which `scripts/with-postgres` exports) are
/// removed, so each test states exactly what it configures.
pub fn tollgate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("TOLLGATE_") || n == "DATABASE_URL") {
            command.env_remove(&name);
        }
    }
    command.env("TOLLGATE_LOG", "warn");
    command.stdin(Stdio::null()).kill_on_drop(true);
    command
}

/// Who sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum As {
    Admin,
    Gateway,
    Nobody,
}

pub struct Server {
    child: Child,
    /// Everything the server wrote on stderr, drained as it is written: a
    /// pipe nobody reads fills up, and a server logging into it then blocks.
    stderr: Option<tokio::task::JoinHandle<String>>,
    pub base: String,
    /// What the server printed on stdout up to and including its listening line.
    pub banner: Vec<String>,
    client: reqwest::Client,
}

impl Server {
    /// Starts `tollgate serve` on 127.0.0.1:0 with both test tokens and the
    /// given extra arguments and environment.
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        match Server::try_start(args, env).await {
            Ok(server) => server,
            Err((status, stderr)) => panic!("tollgate serve exited with {status}:\n{stderr}"),
        }
    }

    /// Like `start`, but a server that exits before listening is an `Err` with
    /// its exit status and stderr.
    pub async fn try_start(args: &[&str], env: &[(&str, &str)]) -> Result<Server, (String, String)> {
        Server::try_start_on("127.0.0.1:0", args, env).await
    }

    /// Like `try_start`, on `listen`.
    pub async fn try_start_on(listen: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Server, (String, String)> {
        let tokens = [("TOLLGATE_ADMIN_TOKEN", ADMIN), ("TOLLGATE_GATEWAY_TOKEN", GATEWAY)];
        let env: Vec<(&str, &str)> = tokens.into_iter().chain(env.iter().copied()).collect();
        Server::spawn_on(listen, args, &env).await
    }

    /// Starts `tollgate serve` on 127.0.0.1:0 with exactly this configuration.
    pub async fn spawn(args: &[&str], env: &[(&str, &str)]) -> Result<Server, (String, String)> {
        Server::spawn_on("127.0.0.1:0", args, env).await
    }

    /// Starts `tollgate serve` on `listen` with exactly this configuration.
    pub async fn spawn_on(listen: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Server, (String, String)> {
        let mut command = tollgate();
        command
            .args(["serve", "--listen", listen])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("the tollgate binary starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
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
            let _ = stderr.read_to_string(&mut text).await;
            return Err((status, text));
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let client = reqwest::Client::builder().no_proxy().build().expect("an HTTP client");
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text).await;
            text
        });
        Ok(Server { child, stderr: Some(stderr), base, banner, client })
    }

    /// Sends one request; returns its status and JSON body (`Null` when empty,
    /// a string when not JSON).
    pub async fn call(&self, who: As, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let bytes = body.map(|b| serde_json::to_vec(&b).expect("JSON")).unwrap_or_default();
        let token = match who {
            As::Admin => Some(ADMIN),
            As::Gateway => Some(GATEWAY),
            As::Nobody => None,
        };
        self.send(token, method, path, bytes).await
    }

    /// Sends raw bytes with an optional bearer token.
    pub async fn send(&self, token: Option<&str>, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base)).body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status();
        let bytes = response.bytes().await.expect("the body arrives");
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }

    /// A request expected to answer `expected`; returns the body.
    pub async fn ok(&self, who: As, method: Method, path: &str, body: Option<Value>, expected: StatusCode) -> Value {
        let (status, value) = self.call(who, method.clone(), path, body).await;
        assert_eq!(status, expected, "{method} {path}: {value}");
        value
    }

    /// Kills the process with SIGKILL, as a crash would, and waits for it.
    pub async fn kill(mut self) {
        let pid = self.child.id().expect("the server is running");
        assert!(signal("KILL", pid).is_ok_and(|s| s.success()), "kill -KILL {pid}");
        tokio::time::timeout(PROCESS_WAIT_MAX, self.child.wait())
            .await
            .expect("the server dies after SIGKILL")
            .expect("the server's exit status");
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it
    /// exited successfully, and its stderr.
    pub async fn terminate(mut self) -> (bool, String) {
        let pid = self.child.id().expect("the server is running");
        let killed = signal("TERM", pid);
        assert!(killed.is_ok_and(|s| s.success()), "kill -TERM {pid}");
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

/// Asserts an error response: its status, stable code and `retryable`.
pub fn assert_error(actual: (StatusCode, Value), status: StatusCode, code: &str, retryable: bool) {
    let (actual_status, body) = actual;
    assert_eq!(actual_status, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["retryable"], retryable, "{body}");
}

/// Runs `tollgate ARGS` to completion; returns success, stdout and stderr.
pub async fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let output = tokio::time::timeout(
        PROCESS_WAIT_MAX,
        tollgate().args(args).envs(env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::piped()).output(),
    )
    .await
    .expect("tollgate finishes")
    .expect("tollgate runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
