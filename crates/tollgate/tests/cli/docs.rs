//! The documents stand alone and point at code that exists.
//!
//! Every relative link in the repository's Markdown must name a file that
//! exists, and every link in `docs/rules.md` whose text names a function, type
//! or test must point at a file that contains that name, so a rule's
//! "enforced by" and "proved by" columns cannot silently go stale when code
//! moves. No file cites a document outside the repository.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository root")
}

/// The Markdown files a reader is pointed at.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        ["README.md", "ARCHITECTURE.md", "CHANGELOG.md"].iter().map(|name| root.join(name)).collect();
    let docs = std::fs::read_dir(root.join("docs")).expect("docs/");
    files.extend(
        docs.map(|entry| entry.expect("a docs entry").path())
            .filter(|path| path.extension().is_some_and(|extension| extension == "md")),
    );
    files.sort();
    files
}

/// `(text, target)` of every inline Markdown link `[text](target)`.
fn links(markdown: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = markdown;
    while let Some(close) = rest.find("](") {
        let text_start = rest[..close].rfind('[').map_or(close, |open| open + 1);
        let text = rest[text_start..close].to_owned();
        let after = &rest[close + 2..];
        let Some(end) = after.find(')') else { break };
        found.push((text, after[..end].to_owned()));
        rest = &after[end..];
    }
    found
}

fn is_local(target: &str) -> bool {
    !(target.starts_with("http://")
        || target.starts_with("https://")
        || target.starts_with("mailto:")
        || target.starts_with('#'))
}

#[test]
fn every_relative_link_names_a_file_that_exists() {
    let root = root();
    let mut broken = Vec::new();
    for document in documents(&root) {
        let text = std::fs::read_to_string(&document).expect("a readable document");
        for (_, target) in links(&text).into_iter().filter(|(_, target)| is_local(target)) {
            let path = target.split('#').next().unwrap_or_default();
            if !document.parent().expect("a directory").join(path).exists() {
                broken.push(format!("{}: {target}", document.strip_prefix(&root).unwrap_or(&document).display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}

/// The name a link's text gives: `GrantPolicy::expiry` names `expiry`, a file
/// name names nothing beyond the file.
fn named_item(text: &str) -> Option<&str> {
    let name = text.strip_prefix('`')?.strip_suffix('`')?;
    let item = name.rsplit("::").next()?;
    let is_file = [".rs", ".sql", ".v", ".md"].iter().any(|extension| item.ends_with(extension));
    let is_identifier = item.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    (!is_file && is_identifier && !item.is_empty()).then_some(item)
}

fn contains_word(haystack: &str, word: &str) -> bool {
    haystack.match_indices(word).any(|(at, _)| {
        let before = haystack[..at].chars().next_back();
        let after = haystack[at + word.len()..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        boundary(before) && boundary(after)
    })
}

#[test]
fn every_rule_links_to_code_and_tests_that_exist() {
    let root = root();
    let rules = root.join("docs/rules.md");
    let text = std::fs::read_to_string(&rules).expect("docs/rules.md");
    let mut checked = 0;
    let mut stale = Vec::new();
    for (link_text, target) in links(&text) {
        let Some(item) = named_item(&link_text) else { continue };
        let file = rules.parent().expect("docs/").join(&target);
        let source = std::fs::read_to_string(&file).unwrap_or_default();
        checked += 1;
        if !contains_word(&source, item) {
            stale.push(format!("{link_text} is not in {target}"));
        }
    }
    assert!(checked >= 50, "docs/rules.md names only {checked} items; the table format changed?");
    assert!(stale.is_empty(), "docs/rules.md names code that is not where it points:\n{}", stale.join("\n"));
}

#[test]
fn nothing_cites_a_document_outside_the_repository() {
    let root = root();
    let mut citing = Vec::new();
    let mut pending = vec![root.join("crates"), root.join("docs")];
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    while let Some(directory) = pending.pop() {
        for entry in std::fs::read_dir(&directory).expect("a readable directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for (number, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            if lower.contains(&["spec", " §"].concat()) || lower.contains(&["seed", " 00"].concat()) {
                citing.push(format!("{}:{}: {line}", file.strip_prefix(&root).unwrap_or(&file).display(), number + 1));
            }
        }
    }
    assert!(citing.is_empty(), "cite a link into the repository instead:\n{}", citing.join("\n"));
}
