//! ppp's layers, kept by a test: the core never names the command line,
//! the sandbox lifecycle never names the kits built on it (issue 16), and
//! no module imports itself back, directly or through others (issue 29,
//! ADR 0046; docs/architecture.md, "Layers").
//!
//! Every file under `src/` is read with its comments and literals blanked
//! out, and every path that starts at the crate root is followed to its
//! first module: `crate::cli::X`, each item of `crate::{cli::X, kit}`, and
//! `super::…::cli` once its `super`s climb to the root. A file naming a
//! module its layer may not fails the test with `file:line`.
//!
//! Only paths are checked, not what the compiler resolves them to: a
//! re-export (`pub use crate::cli::X` in an allowed file) would hide an
//! edge, and is itself the thing a review should catch.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One rule: files for which `applies` holds may not name the crate's
/// top-level module `module`.
struct Rule {
    module: &'static str,
    applies: fn(&str) -> bool,
    why: &'static str,
}

/// The front ends: the only files that may name the command line. `tui/`
/// and `setup.rs` are commands with more than one file. `diagnose.rs` is
/// not: it collects the report from the core (the daemon's status from
/// `proxy::status`), and `cmd/diagnose.rs` prints it.
fn below_the_command_line(file: &str) -> bool {
    const FRONT: &[&str] = &["main.rs", "lib.rs", "cli.rs", "setup.rs"];
    !(FRONT.contains(&file) || file.starts_with("cmd/") || file.starts_with("tui/"))
}

fn in_sandbox(file: &str) -> bool {
    file.starts_with("sandbox/")
}

const RULES: &[Rule] = &[
    Rule {
        module: "cli",
        applies: below_the_command_line,
        why: "the core takes its own types; the command builds them from the parsed arguments",
    },
    Rule {
        module: "cmd",
        applies: below_the_command_line,
        why: "the core is called by commands, never the reverse; move what both need down",
    },
    Rule {
        module: "kit",
        applies: in_sandbox,
        why: "kits build on the sandbox lifecycle; it takes them as `lifecycle::Extension`s",
    },
];

#[test]
fn layers_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found only {} files under `{}`", files.len(), src.display());
    let mut broken = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(path).unwrap();
        for (line, module) in crate_modules(&text, &module_path(&rel)) {
            for rule in RULES.iter().filter(|r| r.module == module && (r.applies)(&rel)) {
                broken.push(format!("src/{rel}:{line}: names `crate::{module}`: {}", rule.why));
            }
        }
    }
    assert!(broken.is_empty(), "imports against the layers (docs/architecture.md):\n{}\n", broken.join("\n"));
}

/// No two modules import each other, directly or through others (issue
/// 29): a circle means neither side can be read, tested or moved without
/// the other, and it grows. Every path from the crate root in every file
/// (`crate::…`, `super::…`, `self::…`, in `use` and in code) is followed to
/// the deepest module a file under `src/` holds; an edge between a module
/// and one it contains (or is contained in) is not counted, since Rust
/// makes those one unit (children see the parent's private items, a parent
/// re-exports its children). Each circle found is named with the file and
/// line of each of its imports.
#[test]
fn no_module_imports_itself_back() {
    let graph = import_graph();
    assert!(graph.len() > 20, "found only {} modules under `src/`", graph.len());
    let circles = circles(&graph);
    assert!(
        circles.is_empty(),
        "modules that import each other (cut each by moving what both sides need down a layer, \
         into a small module or the lower one; docs/architecture.md):\n{}\n",
        circles.join("\n")
    );
}

/// A module (its path from the crate root) and, for each module it
/// names, where it first does.
type Graph = BTreeMap<Vec<String>, BTreeMap<Vec<String>, String>>;

fn import_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let rels: Vec<String> =
        files.iter().map(|p| p.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/")).collect();
    // `main.rs` is the binary, a crate of its own that calls the library.
    let known: BTreeSet<Vec<String>> = rels.iter().filter(|r| *r != "main.rs").map(|r| module_path(r)).collect();
    let mut graph = Graph::new();
    for (path, rel) in files.iter().zip(&rels).filter(|(_, r)| *r != "main.rs") {
        let from = module_path(rel);
        let edges = graph.entry(from.clone()).or_default();
        for (line, named) in crate_paths(&std::fs::read_to_string(path).unwrap(), &from) {
            let to = resolve(&named, &known);
            if !to.starts_with(&from) && !from.starts_with(&to) {
                edges.entry(to).or_insert_with(|| format!("src/{rel}:{line}"));
            }
        }
    }
    graph
}

/// The deepest module in `known` that `path` starts with.
fn resolve(path: &[String], known: &BTreeSet<Vec<String>>) -> Vec<String> {
    (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| known.contains(p)).unwrap_or_default()
}

/// One line per circle: each set of modules that reach each other, shown
/// as a shortest way round from its first module.
fn circles(graph: &Graph) -> Vec<String> {
    let reach = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(m) = todo.pop() {
            for next in graph.get(m).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next) {
                    todo.push(next);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&Vec<String>, BTreeSet<&Vec<String>>> = graph.keys().map(|m| (m, reach(m))).collect();
    let mut shown = BTreeSet::new();
    let mut out = Vec::new();
    for (m, from_m) in &reaches {
        if shown.contains(m) || !from_m.contains(m) {
            continue;
        }
        let circle: BTreeSet<&Vec<String>> =
            from_m.iter().copied().filter(|n| reaches.get(n).is_some_and(|r| r.contains(m))).collect();
        shown.extend(circle.iter().copied());
        // Breadth first inside the circle, back to `m`.
        let mut back: BTreeMap<&Vec<String>, &Vec<String>> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([*m]);
        'search: while let Some(at) = queue.pop_front() {
            for next in graph[at].keys().filter(|n| circle.contains(n)) {
                if !back.contains_key(next) {
                    back.insert(next, at);
                    if next == *m {
                        break 'search;
                    }
                    queue.push_back(next);
                }
            }
        }
        let mut way = vec![*m];
        let mut at = back[*m];
        while at != *m {
            way.push(at);
            at = back[at];
        }
        way.reverse();
        way.insert(0, *m);
        let name = |p: &Vec<String>| p.join("::");
        let steps: Vec<String> = way.windows(2).map(|w| format!("{} ({})", name(w[1]), graph[w[0]][w[1]])).collect();
        let others = circle.len() + 1 - way.len();
        let more = if others > 0 { format!(" [and {others} more in the same circle]") } else { String::new() };
        out.push(format!("  {} → {}{more}", name(m), steps.join(" → ")));
    }
    out
}

/// Every path from the crate root that `text` names, made absolute, with
/// its line: `crate::a::b`, `$crate::a`, `self::a`, `super::…::a` (from the
/// inline module it is written in), and each leaf of a `use` group
/// (`crate::{a::{b, c}, d}`). The path stops at the first token that is not
/// a name. A `#[cfg(test)] mod` is skipped: a unit test may build its input
/// with a sibling module without either module depending on the other, and
/// it is not in the product.
fn crate_paths(text: &str, module: &[String]) -> Vec<(usize, Vec<String>)> {
    let toks = tokens(&blank(text));
    let mut found = Vec::new();
    let mut depth = 0usize;
    // The inline modules around the token: name, brace depth, `#[cfg(test)]`.
    let mut inline: Vec<(String, usize, bool)> = Vec::new();
    for i in 0..toks.len() {
        let t = toks[i].text.as_str();
        match t {
            "{" => {
                depth += 1;
                if i >= 2 && toks[i - 2].text == "mod" && is_ident(&toks[i - 1].text) {
                    let attr = ["#", "[", "cfg", "(", "test", ")", "]"];
                    let cfg_test = i >= 9 && toks[i - 9..i - 2].iter().zip(attr).all(|(t, a)| t.text == a);
                    inline.push((toks[i - 1].text.clone(), depth, cfg_test));
                }
            }
            "}" => {
                if inline.last().is_some_and(|(_, d, _)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        let in_tests = inline.iter().any(|(_, _, test)| *test);
        if in_tests || (i > 0 && toks[i - 1].text == "::") || !matches!(t, "crate" | "super" | "self") {
            continue;
        }
        let mut here: Vec<String> = module.to_vec();
        here.extend(inline.iter().map(|(n, _, _)| n.clone()));
        let mut base = match t {
            "crate" => Vec::new(),
            _ => here,
        };
        let mut j = i;
        if t == "super" {
            while toks.get(j).is_some_and(|t| t.text == "super") && toks.get(j + 1).is_some_and(|t| t.text == "::") {
                base.pop();
                j += 2;
            }
            j -= 1; // onto the last `::`
        } else {
            j += 1;
        }
        if toks.get(j).is_some_and(|t| t.text == "::") {
            use_tree(&toks, j + 1, base, &mut found);
        }
    }
    found
}

/// The leaves of the path or `use` tree that starts at `at`, after `prefix`.
fn use_tree(toks: &[Token], mut at: usize, mut prefix: Vec<String>, out: &mut Vec<(usize, Vec<String>)>) {
    while let Some(t) = toks.get(at) {
        if t.text == "{" {
            let mut depth = 0;
            let mut item_start = true;
            for (k, u) in toks.iter().enumerate().skip(at) {
                match u.text.as_str() {
                    "{" => {
                        depth += 1;
                        if depth == 1 {
                            continue;
                        }
                    }
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    "," if depth == 1 => {
                        item_start = true;
                        continue;
                    }
                    _ => {}
                }
                if depth == 1 && item_start {
                    item_start = false;
                    if u.text == "self" || u.text == "*" {
                        out.push((u.line, prefix.clone()));
                    } else {
                        use_tree(toks, k, prefix.clone(), out);
                    }
                }
            }
            return;
        }
        if !is_ident(&t.text) || t.text == "self" {
            break;
        }
        prefix.push(t.text.clone());
        if toks.get(at + 1).is_some_and(|n| n.text == "::") {
            at += 2;
        } else {
            break;
        }
    }
    let line = toks.get(at).or(toks.last()).map_or(0, |t| t.line);
    out.push((line, prefix));
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module a file under `src/` is: `sandbox/lifecycle.rs` is
/// `["sandbox", "lifecycle"]`, `sandbox/mod.rs` `["sandbox"]`, `lib.rs`
/// and `main.rs` the root.
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Each top-level module of the crate that `text` names, with its line:
/// `crate::m`, `$crate::m`, every item of `crate::{m, n::X}`, and
/// `super::…::m` whose `super`s reach the root from `module` (reaching
/// past it counts too: a file cannot see the inline modules it holds).
fn crate_modules(text: &str, module: &[String]) -> Vec<(usize, String)> {
    let toks = tokens(&blank(text));
    let mut found = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let after_path = i > 0 && toks[i - 1].text == "::";
        let at_root = match toks[i].text.as_str() {
            "crate" if !after_path => Some(i + 1),
            "super" if !after_path => {
                let mut j = i;
                let mut ups = 0;
                while toks.get(j).is_some_and(|t| t.text == "super") && toks.get(j + 1).is_some_and(|t| t.text == "::")
                {
                    ups += 1;
                    j += 2;
                }
                // `j` is past the last `super ::`; step back onto that `::`.
                (ups >= module.len()).then(|| j - 1)
            }
            _ => None,
        };
        if let Some(sep) = at_root
            && toks.get(sep).is_some_and(|t| t.text == "::")
        {
            match toks.get(sep + 1) {
                Some(t) if t.text == "{" => found.extend(group_heads(&toks, sep + 1)),
                Some(t) if is_ident(&t.text) => found.push((t.line, t.text.clone())),
                _ => {}
            }
        }
        i += 1;
    }
    found
}

/// The first name of each item in the `{ … }` group that opens at `open`.
fn group_heads(toks: &[Token], open: usize) -> Vec<(usize, String)> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for t in &toks[open..] {
        match t.text.as_str() {
            "{" => {
                depth += 1;
                if depth == 1 {
                    item_start = true;
                }
            }
            "}" => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            "," if depth == 1 => item_start = true,
            s if depth == 1 && item_start => {
                item_start = false;
                if is_ident(s) && s != "self" {
                    heads.push((t.line, s.to_owned()));
                }
            }
            _ => {}
        }
    }
    heads
}

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

#[derive(Debug)]
struct Token {
    text: String,
    line: usize,
}

/// Identifiers (a `$` before one is dropped), `::` and single punctuation.
fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() || c == '$' {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token { text: chars[start..i].iter().collect(), line });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token { text: "::".into(), line });
            i += 2;
        } else {
            out.push(Token { text: c.to_string(), line });
            i += 1;
        }
    }
    out
}

/// `text` with every comment (doc comments too) and the inside of every
/// string and character literal replaced by spaces; line breaks stay, so
/// lines still count. Raw strings (`r#"…"#`), byte and C strings, nested
/// block comments and lifetimes (`'a`, not a literal) are told apart.
fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let keep_lines = |s: &[char], out: &mut String| {
        out.extend(s.iter().map(|&ch| if ch == '\n' { '\n' } else { ' ' }));
    };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            let end = c[i..].iter().position(|&ch| ch == '\n').map_or(c.len(), |p| i + p);
            keep_lines(&c[i..end], &mut out);
            i = end;
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            let mut j = i;
            while j < c.len() {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            let end = j.min(c.len());
            keep_lines(&c[i..end], &mut out);
            i = end;
        } else if let Some((prefix, hashes)) = raw_string_start(&c, i) {
            // r"…", r#"…"#, br"…", cr"…": no escapes; ends at `"` + hashes.
            let closes = |j: usize| c[j] == '"' && c[j + 1..].iter().take_while(|&&h| h == '#').count() >= hashes;
            let mut j = i + prefix + hashes + 1;
            while j < c.len() && !closes(j) {
                j += 1;
            }
            let end = (j + 1 + hashes).min(c.len());
            keep_lines(&c[i..end], &mut out);
            i = end;
        } else if c[i] == '"' || (matches!(c[i], 'b' | 'c') && next == Some('"') && !ident_before(&c, i)) {
            let open = if c[i] == '"' { i } else { i + 1 };
            let mut j = open + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(c.len());
            keep_lines(&c[i..end], &mut out);
            i = end;
        } else if c[i] == '\'' {
            // 'x', '\n', '\u{1F600}' are literals; 'a without a closing
            // quote right after is a lifetime or a label.
            let end = if next == Some('\\') {
                c[i + 2..].iter().position(|&ch| ch == '\'').map(|p| i + 2 + p + 1)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            if let Some(end) = end {
                keep_lines(&c[i..end], &mut out);
                i = end;
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Whether a raw string starts at `i`: its prefix length (`r`, `br`,
/// `cr`) and number of `#`s.
fn raw_string_start(c: &[char], i: usize) -> Option<(usize, usize)> {
    if ident_before(c, i) {
        return None;
    }
    let prefix = match (c.get(i), c.get(i + 1)) {
        (Some('r'), _) => 1,
        (Some('b' | 'c'), Some('r')) => 2,
        _ => return None,
    };
    let hashes = c[i + prefix..].iter().take_while(|&&h| h == '#').count();
    (c.get(i + prefix + hashes) == Some(&'"')).then_some((prefix, hashes))
}

/// Whether `c[i]` continues an identifier (so `for"` is not `r"`).
fn ident_before(c: &[char], i: usize) -> bool {
    i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')
}

mod scanner {
    use super::*;

    fn named(text: &str, file: &str) -> Vec<(usize, String)> {
        crate_modules(text, &module_path(file))
    }

    fn pairs(v: &[(usize, &str)]) -> Vec<(usize, String)> {
        v.iter().map(|(l, s)| (*l, (*s).to_owned())).collect()
    }

    #[test]
    fn plain_grouped_and_nested_paths() {
        let text = "use crate::cli::LogLevel;\nuse crate::{agent, cli::X,\n  kit::{self, Loaded}};\nfn f() { crate::cmd::ports::x(); }\n";
        assert_eq!(named(text, "config.rs"), pairs(&[(1, "cli"), (2, "agent"), (2, "cli"), (3, "kit"), (4, "cmd")]));
        assert_eq!(named("pub(crate) fn f() {}\nuse ppp::cli;\nuse self::crate_x;\n", "a.rs"), vec![]);
        assert_eq!(named("macro_rules! m { () => { $crate::cli::X } }", "a.rs"), pairs(&[(1, "cli")]));
    }

    #[test]
    fn supers_count_only_when_they_reach_the_root() {
        assert_eq!(named("use super::super::cli;\n", "sandbox/names.rs"), pairs(&[(1, "cli")]));
        assert_eq!(named("use super::cli;\n", "sandbox/names.rs"), vec![]);
        assert_eq!(named("use super::{kit, x};\n", "sandbox/mod.rs"), pairs(&[(1, "kit"), (1, "x")]));
        assert_eq!(named("use super::*;\n", "config.rs"), vec![]);
        assert_eq!(named("x::super::super::cli", "a/b.rs"), vec![]);
    }

    fn paths(text: &str, file: &str) -> Vec<(usize, String)> {
        crate_paths(text, &module_path(file)).into_iter().map(|(l, p)| (l, p.join("::"))).collect()
    }

    #[test]
    fn paths_are_made_absolute_from_where_they_are_written() {
        let text = "use super::lifecycle::Ui;\nuse super::{Record, machine::{a, b}};\nfn f() { crate::x::y::z(); }\n\
                    mod inner {\n    use super::super::up;\n    use self::deep;\n}\nuse crate::kit::{self, *};\n";
        assert_eq!(
            paths(text, "sandbox/verify.rs"),
            [
                (1, "sandbox::lifecycle::Ui"),
                (2, "sandbox::Record"),
                (2, "sandbox::machine::a"),
                (2, "sandbox::machine::b"),
                (3, "x::y::z"),
                (5, "sandbox::up"),
                (6, "sandbox::verify::inner::deep"),
                (8, "kit"),
                (8, "kit"),
            ]
            .map(|(l, s)| (l, s.to_owned()))
        );
        let tests = "#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::cmd::x;\n}\nuse crate::after;\n";
        assert_eq!(paths(tests, "a.rs"), [(6, "after".to_owned())], "unit tests are skipped, code after them is not");
    }

    #[test]
    fn a_circle_is_named_with_its_imports() {
        let m = |s: &str| s.split("::").map(str::to_owned).collect::<Vec<_>>();
        let edge = |g: &mut Graph, a: &str, b: &str, at: &str| {
            g.entry(m(a)).or_default().insert(m(b), at.to_owned());
            g.entry(m(b)).or_default();
        };
        let mut g = Graph::new();
        edge(&mut g, "a", "b", "src/a.rs:1");
        edge(&mut g, "b", "c::d", "src/b.rs:2");
        edge(&mut g, "c::d", "a", "src/c/d.rs:3");
        edge(&mut g, "c::d", "e", "src/c/d.rs:4");
        edge(&mut g, "e", "f", "src/e.rs:5");
        assert_eq!(circles(&g), ["  a → b (src/a.rs:1) → c::d (src/b.rs:2) → a (src/c/d.rs:3)"]);
        edge(&mut g, "f", "e", "src/f.rs:6");
        assert_eq!(circles(&g).len(), 2, "{:?}", circles(&g));
        let known = [m("a"), m("c"), m("c::d"), vec![]].into_iter().collect();
        assert_eq!(resolve(&m("c::d::Item"), &known), m("c::d"));
        assert_eq!(resolve(&m("c::x::Item"), &known), m("c"));
        assert_eq!(resolve(&m("Item"), &known), Vec::<String>::new());
    }

    #[test]
    fn comments_and_literals_are_not_code() {
        let text = "//! crate::cli\n/// crate::cli::X\n/* crate::cmd /* nested */ crate::kit */\nlet s = \"crate::cli\";\nlet r = r#\"crate::cli \" still\"#;\nlet b = b\"crate::cmd\";\nlet q = '\"'; fn f<'a>(x: &'a str) { crate::kit::y(); }\nlet t = \"a \\\" crate::cli\";\n";
        assert_eq!(named(text, "sandbox/x.rs"), pairs(&[(7, "kit")]));
    }
}
