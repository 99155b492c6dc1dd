//! The house rules that the compiler does not check, read from `src/`: SQL is written only in
//! `store/` (domain modules say what to persist, the store says how, for both backends), no
//! module reaches into the handlers (`proxy/`, `admin/`) except the handlers and the app wiring,
//! no file outgrows one responsibility (about 600 lines, its tests not counted), and the
//! top-level modules stand in layers ([`LAYERS`]): each imports only its own layer and those
//! below, and no import cycle joins top-level modules beyond the [`KNOWN_CYCLES`].

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, as paths relative to the crate root with `/` separators.
fn rust_files(dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src/")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let rel = path.strip_prefix(root).expect("under the crate");
            let rel = rel.to_string_lossy().replace('\\', "/");
            out.push((rel, path));
        }
    }
}

fn sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    assert!(files.len() > 20, "found the sources: {files:?}");
    files
        .into_iter()
        .map(|(rel, path)| (rel, std::fs::read_to_string(path).expect("read source")))
        .collect()
}

/// What a piece of Rust source is made of, split into code and string literals; comments are
/// dropped (they may name SQL or modules freely). Each part carries its 1-based line.
#[derive(Debug, PartialEq)]
enum Part {
    Code(usize, String),
    Literal(usize, String),
}

fn lex(text: &str) -> Vec<Part> {
    let chars: Vec<char> = text.chars().collect();
    let (mut parts, mut code, mut line, mut code_line) = (Vec::new(), String::new(), 1, 1);
    let mut i = 0;
    let flush = |parts: &mut Vec<Part>, code: &mut String, at: usize| {
        if !code.trim().is_empty() {
            parts.push(Part::Code(at, std::mem::take(code)));
        }
        code.clear();
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if c == '"' || (c == 'r' && matches!(next, Some('"' | '#')) && !ident_before(&chars, i)) {
            // A string literal, plain or raw (`r"…"`, `r#"…"#`); `b"…"` ends up here too.
            flush(&mut parts, &mut code, code_line);
            let start_line = line;
            let mut literal = String::new();
            if c == 'r' {
                let mut hashes = 0;
                i += 1;
                while chars.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                i += 1; // the opening quote
                let closing: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                while i < chars.len() && !chars[i..].starts_with(&closing.chars().collect::<Vec<_>>()) {
                    line += usize::from(chars[i] == '\n');
                    literal.push(chars[i]);
                    i += 1;
                }
                i += closing.chars().count();
            } else {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        literal.push(chars[i]);
                        i += 1;
                    }
                    line += usize::from(chars[i] == '\n');
                    literal.push(chars[i]);
                    i += 1;
                }
                i += 1;
            }
            parts.push(Part::Literal(start_line, literal));
            code_line = line;
            continue;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\''), else a lifetime or label.
            let end = if next == Some('\\') {
                (i + 2..chars.len()).find(|&j| chars[j] == '\'' && j > i + 2)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => i = end + 1,
                None => {
                    code.push(c);
                    i += 1;
                }
            }
            continue;
        } else {
            if c == '\n' {
                line += 1;
                flush(&mut parts, &mut code, code_line);
                code_line = line;
            } else {
                code.push(c);
            }
            i += 1;
            continue;
        }
    }
    flush(&mut parts, &mut code, code_line);
    parts
}

/// Whether `chars[i]` continues an identifier (the `r` of `for"` is not a raw string).
fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The SQL a string literal holds, if it looks like a statement.
fn sql_in(literal: &str) -> Option<&'static str> {
    let words: Vec<&str> = literal.split_whitespace().collect();
    let has = |w: &str| words.contains(&w);
    let pair = |a: &str, b: &str| words.windows(2).any(|p| p[0] == a && p[1] == b);
    [
        (has("SELECT") && has("FROM"), "SELECT … FROM"),
        (pair("INSERT", "INTO"), "INSERT INTO"),
        (has("UPDATE") && has("SET"), "UPDATE … SET"),
        (pair("DELETE", "FROM"), "DELETE FROM"),
        (pair("CREATE", "TABLE") || pair("CREATE", "INDEX"), "CREATE"),
        (
            pair("ALTER", "TABLE") || pair("DROP", "TABLE"),
            "ALTER/DROP TABLE",
        ),
    ]
    .into_iter()
    .find_map(|(found, what)| found.then_some(what))
}

/// Code that runs SQL itself rather than asking the store.
const SQL_CALLS: [&str; 7] = [
    "sqlx::query",
    "rusqlite::",
    "query_as(",
    "query_as::<",
    "query_scalar(",
    "QueryBuilder",
    "sqlx::Executor",
];

#[test]
fn sql_is_written_only_in_the_store() {
    let mut found = Vec::new();
    for (file, text) in sources() {
        if file.starts_with("src/store/") {
            continue;
        }
        for part in lex(&text) {
            match part {
                Part::Code(line, code) => {
                    for call in SQL_CALLS {
                        if code.contains(call) {
                            found.push(format!("{file}:{line}: {call}"));
                        }
                    }
                }
                Part::Literal(line, literal) => {
                    if let Some(what) = sql_in(&literal) {
                        found.push(format!("{file}:{line}: {what} in {literal:?}"));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "SQL outside src/store/ (give the statement a store method):\n{}",
        found.join("\n")
    );
}

/// The most lines a source file has beside its test modules.
const MAX_LINES: usize = 650;

/// Files allowed to be longer, each with its reason (none today: split a file by concern before
/// adding one).
const LONGER: &[(&str, &str)] = &[];

/// Lines of `text` outside `#[cfg(test)] mod … { … }` blocks.
fn lines_beside_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let (mut count, mut i) = (0, 0);
    while i < lines.len() {
        let test_mod = lines[i].trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|l| l.trim_start().starts_with("mod ") && l.ends_with('{'));
        if test_mod {
            let indent = lines[i + 1].len() - lines[i + 1].trim_start().len();
            let close = format!("{}}}", " ".repeat(indent));
            i += 2;
            while i < lines.len() && lines[i] != close {
                i += 1;
            }
        } else {
            count += 1;
        }
        i += 1;
    }
    count
}

#[test]
fn no_file_outgrows_one_responsibility() {
    let mut found = Vec::new();
    for (file, text) in sources() {
        // A `tests.rs` is a test module of its own (`#[cfg(test)] mod tests;` beside it).
        let n = if file.ends_with("/tests.rs") {
            0
        } else {
            lines_beside_tests(&text)
        };
        if n > MAX_LINES && !LONGER.iter().any(|(f, _)| *f == file) {
            found.push(format!("{file}: {n} lines beside its tests"));
        }
    }
    assert!(
        found.is_empty(),
        "files over {MAX_LINES} lines (split them by responsibility, or move inline tests to a \
         sibling file):\n{}",
        found.join("\n")
    );
    assert_eq!(
        lines_beside_tests("fn a() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\nfn b() {}\n"),
        2
    );
}

/// The handlers, and the wiring that builds the router and the state from them.
fn may_use_handlers(file: &str) -> bool {
    [
        "src/proxy/",
        "src/admin/",
        "src/app.rs",
        "src/app/",
        "src/lib.rs",
        "src/main.rs",
    ]
    .iter()
    .any(|allowed| file.starts_with(allowed))
}

#[test]
fn only_the_handlers_and_the_wiring_use_handler_modules() {
    let mut found = Vec::new();
    for (file, text) in sources() {
        // The proxy and the admin API do not reach into each other either.
        let forbidden: &[&str] = if file.starts_with("src/proxy/") {
            &["crate::admin"]
        } else if file.starts_with("src/admin/") {
            &["crate::proxy"]
        } else if may_use_handlers(&file) {
            &[]
        } else {
            &["crate::proxy", "crate::admin"]
        };
        for part in lex(&text) {
            if let Part::Code(line, code) = part {
                for module in forbidden {
                    if code.contains(module) {
                        found.push(format!("{file}:{line}: {}", code.trim()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "handler modules used outside the handlers and the app wiring (move the shared type to \
         a neutral module):\n{}",
        found.join("\n")
    );
}

/// The top-level modules in layers, lowest first: a module may import (`crate::…`) modules of its
/// own layer and of the layers below, never above. A new top-level module takes its place here.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "kernel: shared types and helpers that know no domain",
        &["kernel"],
    ),
    (
        "wire: provider formats, the HTTP transport, the mock upstream",
        &["mock_upstream", "provider", "transport"],
    ),
    (
        "core, field rules: the checks of single values that know no setting",
        &["validate"],
    ),
    ("core, settings: the configuration", &["config"]),
    (
        "core, store: the database, and the deadlines the settings give",
        &["deadline", "store"],
    ),
    (
        "core, errors: the one error enum, naming store and deadline failures",
        &["error"],
    ),
    (
        "core, rules the store keeps: the breaker and the quotas",
        &["breaker", "quota"],
    ),
    ("core, alerts: budget alerts on the quotas", &["alerts"]),
    (
        "services: translation, identity, observability, the serving edge, the request log",
        &["auth", "edge", "observability", "request_log", "translate"],
    ),
    (
        "upstream: the credential pool and dispatch on top of it",
        &["upstream"],
    ),
    (
        "state: the shared state and what fills it",
        &["resources", "state"],
    ),
    (
        "handlers: the proxy, the admin API and the console",
        &["admin", "console", "proxy"],
    ),
    (
        "wiring: start-up, the router, the operator commands",
        &["app", "operator"],
    ),
];

/// The import cycles between top-level modules that remain, each with why: none since issue #42
/// split the core into the layers above. The test fails on any cycle not listed here, and on one
/// listed that is gone.
const KNOWN_CYCLES: &[(&[&str], &str)] = &[];

/// The top-level module of a source file (`src/store/mod.rs` → `store`); none for the crate root.
fn top_module(file: &str) -> Option<&str> {
    let rest = file.strip_prefix("src/")?;
    let first = rest.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then_some(name)
}

/// The top-level modules `code` names through `crate::` (or `$crate::` in a macro), grouped
/// imports (`crate::{a, b::c}`) included, each with the byte offset of its `crate::`.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start => {
                        out.push((at, ident(&group[i..])));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.push((at, ident(rest)));
        }
    }
    out.retain(|(_, m)| !m.is_empty() && m != "self");
    out
}

/// Every import between two top-level modules: `(from, to)` → the first place it is made.
fn module_imports() -> std::collections::BTreeMap<(String, String), String> {
    let mut edges = std::collections::BTreeMap::new();
    for (file, text) in sources() {
        let Some(from) = top_module(&file) else { continue };
        // The code parts joined, so a grouped import over several lines reads as one.
        let (mut code, mut starts) = (String::new(), Vec::new());
        for part in lex(&text) {
            if let Part::Code(line, text) = part {
                starts.push((code.len(), line));
                code.push_str(&text);
                code.push('\n');
            }
        }
        for (at, to) in crate_paths(&code) {
            let line = starts
                .iter()
                .rev()
                .find(|(start, _)| *start <= at)
                .map_or(0, |p| p.1);
            if to != from {
                edges
                    .entry((from.to_owned(), to))
                    .or_insert_with(|| format!("{file}:{line}"));
            }
        }
    }
    edges
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, modules)| modules.contains(&module))
}

#[test]
fn modules_import_only_their_layer_and_those_below() {
    let mut found = Vec::new();
    let mut modules: Vec<String> = sources()
        .iter()
        .filter_map(|(file, _)| top_module(file).map(str::to_owned))
        .collect();
    modules.sort();
    modules.dedup();
    for module in &modules {
        if layer_of(module).is_none() {
            found.push(format!("{module}: in no layer (give it one in LAYERS)"));
        }
    }
    for ((from, to), at) in module_imports() {
        if let (Some(a), Some(b)) = (layer_of(&from), layer_of(&to))
            && b > a
        {
            found.push(format!(
                "{at}: {from} ({}) imports {to} ({}), a layer above",
                LAYERS[a].0, LAYERS[b].0
            ));
        }
    }
    assert!(
        found.is_empty(),
        "imports against the layers (move the shared type down, or pass what is needed in):\n{}",
        found.join("\n")
    );
}

/// Rooms that may import only a few rooms below them, whatever their layer allows: the kernel
/// knows no other room, and observability knows no domain type (it keeps metric and span
/// handles; the handlers name what they count).
const NARROW_ROOMS: &[(&str, &[&str])] = &[("kernel", &[]), ("observability", &["kernel", "config"])];

#[test]
fn the_kernel_and_observability_know_no_domain() {
    let mut found = Vec::new();
    for ((from, to), at) in module_imports() {
        let Some((_, allowed)) = NARROW_ROOMS.iter().find(|(room, _)| *room == from) else {
            continue;
        };
        if !allowed.contains(&to.as_str()) {
            found.push(format!(
                "{at}: {from} imports {to} (it may import only {allowed:?})"
            ));
        }
    }
    assert!(
        found.is_empty(),
        "imports out of a narrow room:\n{}",
        found.join("\n")
    );
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(edges: &std::collections::BTreeMap<(String, String), String>) -> Vec<Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().insert(to);
        graph.entry(to).or_default();
    }
    struct Walk<'a> {
        graph: &'a BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let i = w.index.len();
        w.index.insert(v, i);
        w.low.insert(v, i);
        w.stack.push(v);
        for &next in &w.graph[v] {
            if !w.index.contains_key(next) {
                visit(w, next);
                let low = w.low[v].min(w.low[next]);
                w.low.insert(v, low);
            } else if w.stack.contains(&next) {
                let low = w.low[v].min(w.index[next]);
                w.low.insert(v, low);
            }
        }
        if w.low[v] == w.index[v] {
            let mut component = Vec::new();
            while let Some(m) = w.stack.pop() {
                component.push(m.to_owned());
                if m == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                w.found.push(component);
            }
        }
    }
    let mut walk = Walk {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for &v in graph.keys() {
        if !walk.index.contains_key(v) {
            visit(&mut walk, v);
        }
    }
    walk.found.sort();
    walk.found
}

#[test]
fn no_new_import_cycle_between_top_level_modules() {
    let edges = module_imports();
    let found = cycles(&edges);
    let known: Vec<Vec<String>> = KNOWN_CYCLES
        .iter()
        .map(|(modules, _)| modules.iter().map(|m| (*m).to_owned()).collect())
        .collect();
    for cycle in &found {
        let inside: Vec<String> = edges
            .iter()
            .filter(|((from, to), _)| cycle.contains(from) && cycle.contains(to))
            .map(|((from, to), at)| format!("  {from} -> {to} ({at})"))
            .collect();
        assert!(
            known.contains(cycle),
            "an import cycle between top-level modules {cycle:?} (break it; KNOWN_CYCLES is \
             for the old ones):\n{}",
            inside.join("\n")
        );
    }
    for cycle in &known {
        assert!(
            found.contains(cycle),
            "KNOWN_CYCLES lists {cycle:?}, which is no longer a cycle as listed: shrink the list \
             to what remains ({found:?})"
        );
    }
    // The detector itself: a -> b -> a is a cycle, c -> a is not part of it.
    let edge = |a: &str, b: &str| ((a.to_owned(), b.to_owned()), String::new());
    let toy = [edge("a", "b"), edge("b", "a"), edge("c", "a")]
        .into_iter()
        .collect();
    assert_eq!(cycles(&toy), [vec!["a".to_owned(), "b".to_owned()]]);
    assert_eq!(
        crate_paths("use crate::{a::B,\n c}; $crate::d::e!(); my_crate::f")
            .into_iter()
            .map(|(_, m)| m)
            .collect::<Vec<_>>(),
        ["a", "c", "d"]
    );
}

/// The lexer itself: what the rules above rely on.
#[test]
fn the_lexer_separates_code_literals_and_comments() {
    let text = "let a = \"SELECT x FROM t\"; // sqlx::query\n/* x */ let b = r#\"say \"hi\"\"#;\nlet c = '\"'; fn f<'a>(x: &'a str) {}\n";
    assert_eq!(
        lex(text),
        [
            Part::Code(1, "let a = ".into()),
            Part::Literal(1, "SELECT x FROM t".into()),
            Part::Code(1, "; ".into()),
            Part::Code(2, " let b = ".into()),
            Part::Literal(2, "say \"hi\"".into()),
            Part::Code(2, ";".into()),
            Part::Code(3, "let c = ; fn f<'a>(x: &'a str) {}".into()),
        ]
    );
    assert_eq!(sql_in("SELECT id FROM api_keys"), Some("SELECT … FROM"));
    assert_eq!(sql_in("select a model from the list"), None);
    assert_eq!(sql_in("UPDATE api_keys SET x = 1"), Some("UPDATE … SET"));
}
