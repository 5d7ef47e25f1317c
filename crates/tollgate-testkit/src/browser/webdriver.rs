//! The WebDriver plumbing under `Browser`: finding the programs, running
//! chromedriver, the session's HTTP commands, and ending it from `Drop`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Lines};
use tokio::process::{Child, Command};

use super::{BROWSER_WAIT_MAX, Element};

/// The bound on one WebDriver command, above the page-load bound so that a
/// slow page is reported by the driver rather than cut off by the client.
const COMMAND_WAIT_MAX: Duration = Duration::from_secs(60);

/// How much of chromedriver's output is kept for a failure message.
const LOG_BYTES_MAX: usize = 64 * 1024;

/// The key of an element reference in the W3C protocol.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

const INSTALL: &str =
    "install Debian's packages with `apt-get install chromium chromium-driver` (scripts/test installs them)";

/// `--no-sandbox`: as root, Chromium exits with "Running as root without
/// --no-sandbox is not supported", and CI runs as root.
/// `--disable-dev-shm-usage`: a container's /dev/shm is 64 MB by default,
/// which a renderer can exhaust; with the flag it uses /tmp instead.
const CHROMIUM_ARGS: [&str; 5] =
    ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600"];

/// `program` on `PATH`, else in /usr/bin, where Debian installs it.
pub(super) fn locate(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("no `{program}` on PATH or in /usr/bin: {INSTALL}"))
}

/// A running chromedriver, killed when dropped.
pub(super) struct Driver {
    _child: Child,
    pub(super) address: SocketAddr,
    http: reqwest::Client,
    log: Log,
}

impl Driver {
    /// Starts chromedriver with `--port=0`, so that it binds a free port
    /// itself (no other process can take it between a choice and the bind),
    /// and reads the port from the line it prints once listening.
    pub(super) async fn start(program: &Path) -> Driver {
        let mut child = Command::new(program)
            .arg("--port=0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| panic!("{} does not start ({error}): {INSTALL}", program.display()));
        let log = Log::default();
        log.drain(BufReader::new(child.stderr.take().expect("stderr is piped")).lines());
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        let port = tokio::time::timeout(BROWSER_WAIT_MAX, async {
            while let Ok(Some(line)) = stdout.next_line().await {
                log.push(&line);
                let port = line.strip_prefix("ChromeDriver was started successfully on port ");
                if let Some(port) = port.and_then(|p| p.trim_end_matches('.').parse::<u16>().ok()) {
                    return Some(port);
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let Some(port) = port else {
            panic!(
                "chromedriver printed no port (it exited, or took over {BROWSER_WAIT_MAX:?}); its output:\n{}",
                log.text()
            );
        };
        log.drain(stdout);
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(COMMAND_WAIT_MAX)
            .build()
            .expect("an HTTP client for chromedriver");
        Driver { _child: child, address: SocketAddr::from(([127, 0, 0, 1], port)), http, log }
    }

    /// Waits until chromedriver's `/status` says it is ready.
    pub(super) async fn wait_ready(&self) {
        let url = format!("http://{}/status", self.address);
        let ready = tokio::time::timeout(BROWSER_WAIT_MAX, async {
            loop {
                if let Ok(response) = self.http.get(&url).send().await
                    && let Ok(status) = response.json::<Value>().await
                    && status["value"]["ready"] == true
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(ready.is_ok(), "chromedriver not ready within {BROWSER_WAIT_MAX:?}; its output:\n{}", self.log.text());
    }

    pub(super) async fn open_session(&self, chromium: &Path) -> Session {
        let wait_ms = BROWSER_WAIT_MAX.as_millis();
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "timeouts": { "implicit": 0, "pageLoad": wait_ms, "script": wait_ms },
            "goog:chromeOptions": { "binary": chromium, "args": CHROMIUM_ARGS },
        } } });
        let base = format!("http://{}", self.address);
        let reply = match self.http.post(format!("{base}/session")).json(&capabilities).send().await {
            Ok(response) => {
                response.json::<Value>().await.unwrap_or_else(|error| json!({ "error": error.to_string() }))
            }
            Err(error) => json!({ "error": error.to_string() }),
        };
        let Some(id) = reply["value"]["sessionId"].as_str() else {
            panic!("chromedriver opened no session: {reply}\nits output:\n{}", self.log.text());
        };
        Session { http: self.http.clone(), base, path: format!("/session/{id}") }
    }
}

/// chromedriver's output, kept (up to [`LOG_BYTES_MAX`]) for failure
/// messages. Reading it also keeps chromedriver from blocking on a full pipe.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<String>>);

impl Log {
    fn push(&self, line: &str) {
        let mut text = self.0.lock().expect("the log lock");
        if text.len() + line.len() < LOG_BYTES_MAX {
            text.push_str(line);
            text.push('\n');
        }
    }

    fn text(&self) -> String {
        self.0.lock().expect("the log lock").clone()
    }

    fn drain<R: AsyncRead + Unpin + Send + 'static>(&self, mut lines: Lines<BufReader<R>>) {
        let log = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                log.push(&line);
            }
        });
    }
}

/// One WebDriver session, as the browser and its elements address it.
#[derive(Clone)]
pub(super) struct Session {
    http: reqwest::Client,
    /// `http://127.0.0.1:{port}`
    base: String,
    /// `/session/{id}`
    pub(super) path: String,
}

/// An error the driver answered, by its W3C error code and message.
struct Failure {
    error: String,
    message: String,
}

impl Session {
    async fn send(&self, method: Method, command: &str, body: Option<Value>) -> Result<Value, Failure> {
        let url = format!("{}{}{command}", self.base, self.path);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap_or_else(|error| panic!("WebDriver {method} {url}: {error}"));
        let succeeded = response.status().is_success();
        let mut reply: Value =
            response.json().await.unwrap_or_else(|error| panic!("WebDriver {method} {url}: no JSON answer: {error}"));
        let value = reply["value"].take();
        if succeeded {
            return Ok(value);
        }
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
        Err(Failure { error: text("error"), message: text("message") })
    }

    pub(super) async fn call(&self, method: Method, command: &str, body: Option<Value>) -> Value {
        self.send(method.clone(), command, body)
            .await
            .unwrap_or_else(|failure| panic!("WebDriver {method} {command}: {}: {}", failure.error, failure.message))
    }

    pub(super) async fn get(&self, command: &str) -> Value {
        self.call(Method::GET, command, None).await
    }

    pub(super) async fn post(&self, command: &str, body: Value) -> Value {
        self.call(Method::POST, command, Some(body)).await
    }

    /// The first element matching `css` within `scope` (`""` for the page,
    /// an element's path for that element).
    pub(super) async fn find(&self, scope: &str, css: &str) -> Option<Element> {
        let query = json!({ "using": "css selector", "value": css });
        match self.send(Method::POST, &format!("{scope}/element"), Some(query)).await {
            Ok(reference) => Some(self.element(&reference)),
            Err(failure) if failure.error == "no such element" => None,
            Err(failure) => panic!("finding `{css}`: {}: {}", failure.error, failure.message),
        }
    }

    pub(super) async fn expect_found(&self, scope: &str, css: &str) -> Element {
        match self.find(scope, css).await {
            Some(element) => element,
            None => panic!("no element matches `{css}` on {}", string(self.get("/url").await)),
        }
    }

    pub(super) async fn find_all(&self, scope: &str, css: &str) -> Vec<Element> {
        let query = json!({ "using": "css selector", "value": css });
        let references = self.post(&format!("{scope}/elements"), query).await;
        let references = references.as_array().unwrap_or_else(|| panic!("elements are a list: {references}"));
        references.iter().map(|reference| self.element(reference)).collect()
    }

    fn element(&self, reference: &Value) -> Element {
        let id = reference[ELEMENT_KEY].as_str().unwrap_or_else(|| panic!("not an element reference: {reference}"));
        Element { session: self.clone(), path: format!("/element/{id}") }
    }
}

pub(super) fn string(value: Value) -> String {
    match value {
        Value::String(text) => text,
        other => panic!("WebDriver answered {other}, not a string"),
    }
}

/// Sends `DELETE {session}` to chromedriver and waits for its answer, without
/// a runtime (see `Drop for Browser`). chromedriver answers once Chromium
/// has quit, so the first bytes of the answer are enough: it keeps the
/// connection open after answering, even when asked to close it. A driver
/// that is already gone is fine.
pub(super) fn end_session(address: SocketAddr, session: &str) {
    let Ok(mut stream) = TcpStream::connect_timeout(&address, BROWSER_WAIT_MAX) else {
        return;
    };
    let _ = stream.set_read_timeout(Some(BROWSER_WAIT_MAX));
    let _ = stream.set_write_timeout(Some(BROWSER_WAIT_MAX));
    let request = format!("DELETE {session} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_ok() {
        let _ = stream.read(&mut [0; 64]);
    }
}

/// Decodes standard base64 with padding (RFC 4648, section 4), as WebDriver
/// sends screenshots.
pub(super) fn base64_decode(text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len() / 4 * 3);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for c in text.bytes().take_while(|&c| c != b'=') {
        let sextet = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: byte {c:#04x}"),
        };
        buffer = (buffer << 6) | u32::from(sextet);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            bytes.push(((buffer >> bits) & 0xff) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_the_rfc_4648_vectors() {
        let vectors = [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ];
        for (encoded, decoded) in vectors {
            assert_eq!(base64_decode(encoded), decoded.as_bytes(), "{encoded}");
        }
        assert_eq!(base64_decode("+/8="), [0xfb, 0xff]);
    }

    #[test]
    fn programs_are_found_and_a_missing_one_is_named_with_how_to_install_it() {
        assert!(locate("sh").ends_with("sh"));
        let panic = std::panic::catch_unwind(|| locate("tollgate-no-such-program")).expect_err("nothing to find");
        let message = panic.downcast_ref::<String>().expect("a formatted panic message");
        assert!(message.starts_with("no `tollgate-no-such-program` on PATH or in /usr/bin: "), "{message}");
        assert!(message.contains("`apt-get install chromium chromium-driver`"), "{message}");
    }
}
