//! A fault-injecting HTTP/1.1 proxy between a client and a real server.
//!
//! Each request is read whole, matched against the proxy's rules by method
//! and path, forwarded on its own upstream connection (so the server applies
//! it exactly as sent) and its whole answer read back; then the matching
//! rule's fault decides what the client sees: nothing (the connection is
//! closed: the answer is lost although the request was applied), the answer
//! late, half of the answer, or a reset before the request is forwarded
//! (nothing applied). Requests no rule matches pass through unchanged, and the
//! client connection stays open for the next request.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_pg::testing::TestDb;

use crate::support::Storage;

/// The largest request or answer the proxy carries; tests send small bodies.
const MESSAGE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// What the client sees of a matched request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The request is applied; the connection closes before the answer.
    DropAnswer,
    /// The request is applied; the answer is held back this long.
    DelayAnswer(Duration),
    /// The request is applied; half of the answer arrives, then the close.
    TruncateAnswer,
    /// The connection is reset before the request is forwarded: not applied.
    Reset,
    /// The request is applied; the answer is held back until
    /// [`FaultProxy::release_held`] is called.
    HoldAnswer,
    /// The request is applied; every `from` in the answer's body reads `to`
    /// (a newer server's wording, say).
    RewriteAnswer { from: &'static str, to: &'static str },
}

/// Applies `fault` to the `nth` (from 1) and following `count - 1` requests
/// whose request line starts with `method` and whose path contains `path`.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub method: &'static str,
    pub path: &'static str,
    pub nth: u32,
    pub count: u32,
    pub fault: Fault,
}

struct RuleState {
    rule: Rule,
    seen: u32,
}

pub(crate) struct FaultProxy {
    pub address: SocketAddr,
    rules: Arc<Mutex<Vec<RuleState>>>,
    faults: Arc<Mutex<Vec<(String, Fault)>>>,
    /// Set by `release_held`; held answers wait for it.
    released: tokio::sync::watch::Sender<bool>,
}

impl FaultProxy {
    pub(crate) async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let address = listener.local_addr().expect("proxy address");
        let rules: Arc<Mutex<Vec<RuleState>>> = Arc::default();
        let faults: Arc<Mutex<Vec<(String, Fault)>>> = Arc::default();
        let (shared_rules, shared_faults) = (rules.clone(), faults.clone());
        let (released, watch_released) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (rules, faults) = (shared_rules.clone(), shared_faults.clone());
                let released = watch_released.clone();
                tokio::spawn(serve_connection(client, upstream, rules, faults, released));
            }
        });
        FaultProxy { address, rules, faults, released }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Lets every held answer through, and those held from now on.
    pub(crate) fn release_held(&self) {
        self.released.send_replace(true);
    }

    pub(crate) fn add(&self, rule: Rule) {
        self.rules.lock().unwrap().push(RuleState { rule, seen: 0 });
    }

    /// The request lines the proxy has applied a fault to, in order.
    pub(crate) fn faults(&self) -> Vec<(String, Fault)> {
        self.faults.lock().unwrap().clone()
    }
}

fn fault_for(rules: &Mutex<Vec<RuleState>>, request_line: &str) -> Option<Fault> {
    let mut rules = rules.lock().unwrap();
    let mut parts = request_line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut chosen = None;
    for state in rules.iter_mut() {
        if state.rule.method == method && path.contains(state.rule.path) {
            state.seen += 1;
            let first = state.rule.nth;
            if chosen.is_none() && state.seen >= first && state.seen < first + state.rule.count {
                chosen = Some(state.rule.fault);
            }
        }
    }
    chosen
}

async fn serve_connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    rules: Arc<Mutex<Vec<RuleState>>>,
    faults: Arc<Mutex<Vec<(String, Fault)>>>,
    mut released: tokio::sync::watch::Receiver<bool>,
) {
    while let Some(request) = read_message(&mut client).await {
        let request_line =
            String::from_utf8_lossy(&request[..request.iter().position(|b| *b == b'\r').unwrap_or(0)]).into_owned();
        let fault = fault_for(&rules, &request_line);
        if let Some(fault) = fault {
            faults.lock().unwrap().push((request_line.clone(), fault));
        }
        if fault == Some(Fault::Reset) {
            let _ = client.set_zero_linger();
            return;
        }
        let mut server = TcpStream::connect(upstream).await.expect("upstream reachable");
        server.write_all(&request).await.expect("forward the request");
        let Some(mut answer) = read_message(&mut server).await else { return };
        match fault {
            Some(Fault::DropAnswer) => return,
            Some(Fault::TruncateAnswer) => {
                let _ = client.write_all(&answer[..answer.len() / 2]).await;
                return;
            }
            Some(Fault::DelayAnswer(delay)) => tokio::time::sleep(delay).await,
            Some(Fault::HoldAnswer) => {
                let _ = released.wait_for(|released| *released).await;
            }
            Some(Fault::RewriteAnswer { from, to }) => answer = rewrite(&answer, from, to),
            Some(Fault::Reset) | None => {}
        }
        if client.write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// `answer` with `from` replaced by `to` in its body and its
/// `Content-Length` set to the new length.
fn rewrite(answer: &[u8], from: &str, to: &str) -> Vec<u8> {
    let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("a whole answer") + 4;
    let head = String::from_utf8_lossy(&answer[..head_end]);
    let body = String::from_utf8_lossy(&answer[head_end..]).replace(from, to);
    let mut rewritten = String::new();
    for line in head.split_inclusive("\r\n") {
        if line.to_ascii_lowercase().starts_with("content-length:") {
            rewritten.push_str(&format!("content-length: {}\r\n", body.len()));
        } else {
            rewritten.push_str(line);
        }
    }
    rewritten.push_str(&body);
    rewritten.into_bytes()
}

/// One HTTP/1.1 message: its head, then `Content-Length` bytes of body; `None`
/// when the peer closes first. The server answers every route with a length.
pub(crate) async fn read_message(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        assert!(bytes.len() + read <= MESSAGE_BYTES_MAX, "a message of at most {MESSAGE_BYTES_MAX} bytes");
        bytes.extend_from_slice(&chunk[..read]);
        let Some(head_end) = bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4) else {
            continue;
        };
        let head = String::from_utf8_lossy(&bytes[..head_end]).to_ascii_lowercase();
        assert!(!head.contains("transfer-encoding: chunked"), "the proxy carries length-delimited messages only");
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .map(|value| value.trim().parse().expect("a numeric content-length"))
            .unwrap_or(0);
        if bytes.len() >= head_end + length {
            assert_eq!(bytes.len(), head_end + length, "one message at a time");
            return Some(bytes);
        }
    }
}

impl FaultProxy {
    /// A rule for one request.
    pub(crate) fn once(&self, method: &'static str, path: &'static str, nth: u32, fault: Fault) {
        self.add(Rule { method, path, nth, count: 1, fault });
    }
}

/// Runs `scenario(postgres: bool)` as two tests: on the memory store and on
/// PostgreSQL (a database of its own, from [`storage`]).
macro_rules! on_both_stores {
    ($scenario:ident: $memory:ident, $postgres:ident) => {
        #[tokio::test]
        async fn $memory() {
            $scenario(false).await;
        }

        #[tokio::test]
        async fn $postgres() {
            $scenario(true).await;
        }
    };
}
pub(crate) use on_both_stores;

/// A fresh store: memory, or a database of its own on PostgreSQL. Keep the
/// `TestDb` for as long as the server runs.
pub(crate) async fn storage(postgres: bool) -> (Storage, Option<TestDb>) {
    if postgres {
        let db = TestDb::create().await;
        (Storage::Postgres { url: db.url().to_owned() }, Some(db))
    } else {
        (Storage::Memory, None)
    }
}
