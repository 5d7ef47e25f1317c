//! One helper for the end-to-end tests: the real `tollgate` binary, started on
//! port 0, and an HTTP client that sends it each request of the shared [`Api`].

use std::path::Path;
use std::process::Stdio;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::process::Command;
pub(crate) use tollgate_testkit::{Api, As, PROCESS_WAIT_MAX, assert_error, signal};
use tollgate_testkit::{ServeProcess, Stderr, body_value, clean_command};

pub(crate) const ADMIN: &str = "admin-token-for-end-to-end-tests";
pub(crate) const GATEWAY: &str = "gateway-token-for-end-to-end-tests";

/// A `tollgate` command with no inherited configuration (see
/// [`clean_command`]).
pub(crate) fn tollgate() -> Command {
    clean_command(Path::new(env!("CARGO_BIN_EXE_tollgate")))
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
        Server::spawn_on("127.0.0.1:0", args, &with_tokens(env)).await
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

/// `env` with both test tokens before it.
pub(crate) fn with_tokens<'a>(env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let tokens = [("TOLLGATE_ADMIN_TOKEN", ADMIN), ("TOLLGATE_GATEWAY_TOKEN", GATEWAY)];
    tokens.into_iter().chain(env.iter().copied()).collect()
}

impl Api for Server {
    const ADMIN_TOKEN: &'static str = ADMIN;
    const GATEWAY_TOKEN: &'static str = GATEWAY;

    /// Sends one request over HTTP to the server.
    async fn send(&self, token: Option<&str>, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base)).body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status();
        let bytes = response.bytes().await.expect("the body arrives");
        (status, body_value(&bytes))
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
