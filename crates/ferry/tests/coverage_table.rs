//! docs/coverage.md keeps its promise: every row whose state is
//! "restored" names at least one test, and every test a row names exists
//! (a conformance program `tests/conformance/NAME.c`, a test function or
//! test file in `crates/*/tests/`, or a unit test in `crates/*/src/`).
//! A state marked restored with nothing that checks its restore is a
//! claim, not a guarantee.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One table row of coverage.md: its line, state cell and test cell.
#[derive(Debug)]
struct Row {
    line: usize,
    what: String,
    state: String,
    tests: String,
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(|c| c.trim().to_string()).collect()
}

/// Every table row but headers and separators. The state is the second
/// column, the test the last (tables have three or four columns).
fn rows(text: &str) -> Vec<Row> {
    let mut out = Vec::new();
    let mut in_table = false;
    for (i, line) in text.lines().enumerate() {
        if !line.trim_start().starts_with('|') {
            in_table = false;
            continue;
        }
        let c = cells(line);
        if !in_table {
            // The header; the separator follows.
            in_table = true;
            continue;
        }
        if c.iter().all(|x| x.chars().all(|ch| ch == '-' || ch == ':')) || c.len() < 3 {
            continue;
        }
        out.push(Row {
            line: i + 1,
            what: c[0].clone(),
            state: c[1].clone(),
            tests: c[c.len() - 1].clone(),
        });
    }
    out
}

/// Text without its parenthesised parts (comments on a test, and the
/// *(g)* / *(t)* marks).
fn without_parens(s: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for ch in s.chars() {
        match ch {
            '(' => depth += 1,
            ')' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    out.replace("**", "")
}

/// The names a test cell gives: identifiers (with `_`), globs such as
/// `chain_*`, and test files (`NAME.rs`). Prose ("same", "every migrated
/// program") names nothing.
fn named_tests(cell: &str) -> Vec<String> {
    let cleaned = without_parens(cell);
    cleaned
        .split([',', ';'])
        .filter_map(|t| {
            let first = t.split_whitespace().next()?.trim_end_matches(['*', ' ']);
            let glob = t.split_whitespace().next()?.ends_with("_*");
            let ident = first.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
            let looks = first.contains('_') || first.ends_with(".rs");
            (ident && looks && !first.is_empty()).then(|| {
                if glob {
                    format!("{first}*")
                } else {
                    first.to_string()
                }
            })
        })
        .collect()
}

/// What a row's test names can resolve to.
struct Known {
    programs: HashSet<String>,
    functions: HashSet<String>,
    files: HashSet<String>,
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Test functions in `text`: `fn NAME(` after a `#[test]`, names listed
/// for `run_on_main_thread`, and the conformance harness's chain tests
/// (`NAME => program`).
fn test_functions(text: &str, out: &mut HashSet<String>) {
    // A binary without libtest lists its tests by name for
    // ferry_testkit::run_on_main_thread.
    let listed = text.contains("run_on_main_thread(&[");
    let mut pending = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("#[test]") {
            pending = true;
            continue;
        }
        if listed {
            if let Some(name) = l.strip_prefix('"').and_then(|r| r.strip_suffix("\",")) {
                out.insert(name.to_string());
            }
        }
        if let Some(rest) = l.split("fn ").nth(1).filter(|_| pending || l.starts_with("fn ")) {
            let name: String =
                rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if pending && !name.is_empty() {
                out.insert(name);
            }
            pending = false;
        }
        if let Some((name, _)) = l.split_once(" => ") {
            if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                out.insert(name.to_string());
            }
        }
    }
}

fn known() -> Known {
    let conf = repo().join("tests/conformance");
    let programs = fs::read_dir(&conf)
        .expect("tests/conformance")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".c").map(str::to_string))
        .collect();
    let mut files = Vec::new();
    for e in fs::read_dir(repo().join("crates")).expect("crates").flatten() {
        rs_files(&e.path().join("tests"), &mut files);
        rs_files(&e.path().join("src"), &mut files);
    }
    let mut functions = HashSet::new();
    let mut names = HashSet::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap_or_default();
        test_functions(&text, &mut functions);
        if let Some(stem) = f.file_stem().and_then(|s| s.to_str()) {
            names.insert(stem.to_string());
            names.insert(format!("{stem}.rs"));
        }
    }
    Known { programs, functions, files: names }
}

impl Known {
    fn resolves(&self, name: &str) -> bool {
        if let Some(prefix) = name.strip_suffix('*') {
            return self.programs.iter().chain(&self.functions).any(|p| p.starts_with(prefix));
        }
        self.programs.contains(name) || self.functions.contains(name) || self.files.contains(name)
    }
}

fn restored(state: &str) -> bool {
    state.starts_with("restored")
}

#[test]
fn every_restored_state_names_a_test_that_exists() {
    let text = fs::read_to_string(repo().join("docs/coverage.md")).expect("docs/coverage.md");
    let known = known();
    let mut problems = Vec::new();
    let mut checked = 0;
    for row in rows(&text) {
        let names = named_tests(&row.tests);
        for n in &names {
            if !known.resolves(n) {
                problems.push(format!(
                    "line {}: {:?} names {n}, which is no conformance program, test or test file",
                    row.line, row.what
                ));
            }
        }
        if restored(&row.state) {
            checked += 1;
            if names.is_empty() {
                problems.push(format!(
                    "line {}: {:?} is marked restored but names no test ({:?})",
                    row.line, row.what, row.tests
                ));
            }
        }
    }
    assert!(checked > 100, "only {checked} restored rows found: is the table format still known?");
    assert!(problems.is_empty(), "docs/coverage.md:\n{}", problems.join("\n"));
}

#[test]
fn the_table_parser_reads_names_marks_and_prose() {
    assert_eq!(
        named_tests("tree_zombie, tree_zombie_signaled"),
        ["tree_zombie", "tree_zombie_signaled"]
    );
    assert_eq!(named_tests("refuses_x *(g)*"), ["refuses_x"]);
    assert_eq!(
        named_tests("sock_tcp_established_pair (options), sock_tcp_listen"),
        ["sock_tcp_established_pair", "sock_tcp_listen"]
    );
    assert_eq!(
        named_tests("chain_* (nine programs, copy-on-write trees among them), pipeline.rs"),
        ["chain_*", "pipeline.rs"]
    );
    assert!(named_tests("- (no program yet)").is_empty());
    assert!(named_tests("same; every byte checked both ways").is_empty());
    assert!(named_tests("every conformance program").is_empty());
    let rows = rows("| a | state | test |\n|---|---|---|\n| x | restored | - |\n\ntext\n");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].line, rows[0].state.as_str(), rows[0].tests.as_str()),
        (3, "restored", "-")
    );
}

/// The generated blocks of docs/coverage.md are the tables capture
/// consults, so a refusal or a restore added in code shows in the docs.
#[test]
fn the_generated_tables_in_coverage_md_are_current() {
    let path = repo().join("docs/coverage.md");
    let text = fs::read_to_string(&path).expect("docs/coverage.md");
    let current = ferry_engine::catalog::splice(&text, &ferry_engine::catalog::tables())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        current == text,
        "docs/coverage.md is out of date: run `ferry coverage --write docs/coverage.md`"
    );
}
