//! One helper for the end-to-end tests: the real `tollgate` binary, started on
//! port 0, and an HTTP client that talks to it.

use std::path::Path;
use std::process::Stdio;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::process::Command;
pub(crate) use tollgate_testkit::{PROCESS_WAIT_MAX, assert_error, signal};
use tollgate_testkit::{ServeProcess, Stderr, body_value, clean_command};

pub(crate) const ADMIN: &str = "admin-token-for-end-to-end-tests";
pub(crate) const GATEWAY: &str = "gateway-token-for-end-to-end-tests";

/// A `tollgate` command with no inherited configuration (see
/// [`clean_command`]).
pub(crate) fn tollgate() -> Command {
    clean_command(Path::new(env!("CARGO_BIN_EXE_tollgate")))
}

/// Who sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum As {
    Admin,
    Gateway,
    Nobody,
}

pub(crate) struct Server {
    process: ServeProcess,
    pub base: String,
    /// What the server printed on stdout up to and including its listening line.
    pub banner: Vec<String>,
    client: reqwest::Client,
}

impl Server {
    /// Starts `tollgate serve` on 127.0.0.1:0 with both test tokens and the
    /// given extra arguments and environment.
    pub(crate) async fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        match Server::try_start(args, env).await {
            Ok(server) => server,
            Err((status, stderr)) => panic!("tollgate serve exited with {status}:\n{stderr}"),
        }
    }

    /// Like `start`, but a server that exits before listening is an `Err` with
    /// its exit status and stderr.
    pub(crate) async fn try_start(args: &[&str], env: &[(&str, &str)]) -> Result<Server, (String, String)> {
        Server::try_start_on("127.0.0.1:0", args, env).await
    }

    /// Like `try_start`, on `listen`.
    pub(crate) async fn try_start_on(
        listen: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Server, (String, String)> {
        let tokens = [("TOLLGATE_ADMIN_TOKEN", ADMIN), ("TOLLGATE_GATEWAY_TOKEN", GATEWAY)];
        let env: Vec<(&str, &str)> = tokens.into_iter().chain(env.iter().copied()).collect();
        Server::spawn_on(listen, args, &env).await
    }

    /// Starts `tollgate serve` on 127.0.0.1:0 with exactly this configuration.
    pub(crate) async fn spawn(args: &[&str], env: &[(&str, &str)]) -> Result<Server, (String, String)> {
        Server::spawn_on("127.0.0.1:0", args, env).await
    }

    /// Starts `tollgate serve` on `listen` with exactly this configuration.
    pub(crate) async fn spawn_on(
        listen: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Server, (String, String)> {
        let mut command = tollgate();
        command.args(["serve", "--listen", listen]).args(args).envs(env.iter().copied());
        let process =
            ServeProcess::start(command, Stderr::Capture).await.map_err(|failure| (failure.status, failure.stderr))?;
        let client = reqwest::Client::builder().no_proxy().build().expect("an HTTP client");
        Ok(Server { base: process.base.clone(), banner: process.banner.clone(), process, client })
    }

    /// Sends one request; returns its status and JSON body (`Null` when empty,
    /// a string when not JSON).
    pub(crate) async fn call(&self, who: As, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let bytes = body.map(|b| serde_json::to_vec(&b).expect("JSON")).unwrap_or_default();
        let token = match who {
            As::Admin => Some(ADMIN),
            As::Gateway => Some(GATEWAY),
            As::Nobody => None,
        };
        self.send(token, method, path, bytes).await
    }

    /// Sends raw bytes with an optional bearer token.
    pub(crate) async fn send(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base)).body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status();
        let bytes = response.bytes().await.expect("the body arrives");
        (status, body_value(&bytes))
    }

    /// A request expected to answer `expected`; returns the body.
    pub(crate) async fn ok(
        &self,
        who: As,
        method: Method,
        path: &str,
        body: Option<Value>,
        expected: StatusCode,
    ) -> Value {
        let (status, value) = self.call(who, method.clone(), path, body).await;
        assert_eq!(status, expected, "{method} {path}: {value}");
        value
    }

    /// Kills the process with SIGKILL, as a crash would, and waits for it.
    pub(crate) async fn kill(mut self) {
        self.process.kill().await;
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it
    /// exited successfully, and its stderr.
    pub(crate) async fn terminate(self) -> (bool, String) {
        self.process.terminate().await
    }
}

/// Runs `tollgate ARGS` to completion; returns success, stdout and stderr.
pub(crate) async fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
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
