//! The README's walkthrough cannot rot: its ```sh blocks run here, in order, in
//! one bash process, against the real binary.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::support::signal;

/// The bound on the whole walkthrough; a reader needs about two minutes.
const WALKTHROUGH_WAIT_MAX: Duration = Duration::from_secs(180);

/// The bodies of the blocks fenced as ```sh (not ```sh norun), in order.
fn shell_blocks(markdown: &str) -> Vec<String> {
    enum Inside {
        Text,
        Runnable(String),
        Other,
    }
    let mut blocks = Vec::new();
    let mut inside = Inside::Text;
    for line in markdown.lines() {
        let fence = line.trim_start().strip_prefix("```");
        inside = match (inside, fence) {
            (Inside::Text, Some(info)) => {
                let words: Vec<&str> = info.split_whitespace().collect();
                if words.first() == Some(&"sh") && !words.contains(&"norun") {
                    Inside::Runnable(String::new())
                } else {
                    Inside::Other
                }
            }
            (Inside::Text, None) => Inside::Text,
            (Inside::Runnable(block), Some(_)) => {
                blocks.push(block);
                Inside::Text
            }
            (Inside::Runnable(mut block), None) => {
                block.push_str(line);
                block.push('\n');
                Inside::Runnable(block)
            }
            (Inside::Other, Some(_)) => Inside::Text,
            (Inside::Other, None) => Inside::Other,
        };
    }
    blocks
}

#[test]
fn blocks_are_found_in_order() {
    let markdown =
        "text\n```sh\necho one\n```\n```sh norun\necho skipped\n```\n```json\n{}\n```\n```sh\necho two\n```\n";
    assert_eq!(shell_blocks(markdown), vec!["echo one\n".to_owned(), "echo two\n".to_owned()]);
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("an address").port()
}

#[tokio::test]
async fn the_walkthrough_runs_as_written() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let markdown = std::fs::read_to_string(root.join("README.md")).expect("README.md exists");
    let blocks = shell_blocks(&markdown);
    assert!(blocks.len() >= 8, "the walkthrough has its steps: {blocks:?}");
    // However the script ends, its background server is stopped: on exit (a
    // failed step included) and on SIGTERM, which the timeout below sends.
    let script = format!(
        "set -euo pipefail\n\
         trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n\
         trap 'exit 143' TERM\n\
         {}",
        blocks.join("\n")
    );

    let binary = PathBuf::from(env!("CARGO_BIN_EXE_tollgate"));
    let bin_dir = binary.parent().expect("the binary has a directory");
    let path = std::env::join_paths(
        std::iter::once(bin_dir.to_path_buf())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .expect("a PATH");
    let work = std::env::temp_dir().join(format!("tollgate-walkthrough-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("a scratch directory");

    // Inherited configuration is cleared, as for the other end-to-end tests.
    let mut bash = tokio::process::Command::new("bash");
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("TOLLGATE_") || n == "DATABASE_URL") {
            bash.env_remove(&name);
        }
    }
    bash.arg("-c")
        .arg(&script)
        .current_dir(&work)
        .env("PATH", path)
        .env("TOLLGATE_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("TOLLGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = bash.spawn().expect("bash runs");
    let pid = child.id().expect("bash has a pid");
    let output = tokio::time::timeout(WALKTHROUGH_WAIT_MAX, child.wait_with_output()).await;
    if output.is_err() {
        let _ = signal("TERM", pid);
    }
    let _ = std::fs::remove_dir_all(&work);
    let output = output.expect("the walkthrough finishes").expect("bash's output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the walkthrough failed ({}):\n{stdout}\n{stderr}", output.status);
    for expected in [
        "listening on http://127.0.0.1:",
        r#""outcome": "duplicate""#,
        r#""reason": "fence_mismatch""#,
        r#""key": "gpt-4o-mini""#,
        "gpt-4o-mini  10",
        "the retry answered lease lse_",
        "is reclaimed",
        "credit:invoice-2024-001",
        "reclaim",
        r#""ok": true"#,
        r#""code": "forbidden""#,
        r#""type":"balance.threshold_crossed""#,
        "signature verified for event",
        "console: http://127.0.0.1:",
        "303",
        r#"data-counter="credited">1000"#,
        r#"data-counter="available">370"#,
    ] {
        assert!(stdout.contains(expected), "the walkthrough's output lacks {expected}:\n{stdout}");
    }
}
