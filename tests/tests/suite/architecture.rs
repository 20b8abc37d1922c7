//! Architecture rules written as absences (see ARCHITECTURE.md), enforced.
//!
//! tenure-core is the pure lease state machine: no async runtime, no storage engine, no network,
//! no clock, no randomness. These tests fail the build the day someone adds one.

use std::path::Path;
use std::process::Command;

use tenure_tests::workspace_root;

/// Crates that would give tenure-core a runtime, I/O, a network or randomness.
const FORBIDDEN_IN_CORE: &[&str] = &[
    "tokio",
    "async-std",
    "futures",
    "mio",
    "socket2",
    "quinn",
    "quinn-proto",
    "rustls",
    "openraft",
    "rocksdb",
    "librocksdb-sys",
    "rand",
    "rand_core",
    "getrandom",
    "libc",
    "tracing",
    "metrics",
];

fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = workspace_root().join("Cargo.toml");
    let output = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
            "-p",
            package,
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn tenure_core_depends_on_no_runtime_storage_network_or_randomness() {
    let names = normal_dependencies("tenure-core");
    assert!(
        names.iter().any(|n| n == "tenure-core"),
        "cargo tree listed nothing: {names:?}"
    );
    let found: Vec<_> = names
        .iter()
        .filter(|name| FORBIDDEN_IN_CORE.contains(&name.as_str()))
        .collect();
    assert!(
        found.is_empty(),
        "tenure-core must not depend on {found:?}; its tree: {names:?}"
    );
}

#[test]
fn tenure_storage_depends_on_no_network_stack() {
    assert_tree_excludes(
        "tenure-storage",
        "rocksdb",
        &[
            "quinn",
            "quinn-proto",
            "rustls",
            "hyper",
            "axum",
            "tonic",
            "reqwest",
        ],
    );
}

#[test]
fn tenure_proto_is_sans_io() {
    assert_tree_excludes(
        "tenure-proto",
        "bytes",
        &[
            "tokio",
            "mio",
            "quinn",
            "quinn-proto",
            "rustls",
            "openraft",
            "rocksdb",
            "tracing",
        ],
    );
}

fn rust_sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn tenure_core_source_reads_no_clock_environment_file_socket_or_thread() {
    // Absences in the library source itself (tests may do as they like).
    let forbidden = [
        "std::time",
        "SystemTime",
        "Instant",
        "std::fs",
        "std::net",
        "std::env",
        "std::thread",
        "std::process",
        "RandomState",
        "thread_rng",
    ];
    let mut files = Vec::new();
    rust_sources(&workspace_root().join("crates/tenure-core/src"), &mut files);
    assert!(!files.is_empty());
    let mut violations = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read source");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden {
                if code.contains(word) {
                    violations.push(format!("{}:{}: {word}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "tenure-core must stay pure:\n{}",
        violations.join("\n")
    );
}

/// Asserts `package`'s normal dependency tree contains `expected` (so the tree was listed) and
/// none of `forbidden`.
fn assert_tree_excludes(package: &str, expected: &str, forbidden: &[&str]) {
    let names = normal_dependencies(package);
    assert!(
        names.iter().any(|n| n == expected),
        "cargo tree listed no {expected}: {names:?}"
    );
    let found: Vec<_> = names
        .iter()
        .filter(|name| forbidden.contains(&name.as_str()))
        .collect();
    assert!(found.is_empty(), "{package} must not depend on {found:?}");
}

#[test]
fn tenure_client_depends_on_no_server_storage_or_raft() {
    assert_tree_excludes(
        "tenure-client",
        "quinn",
        &[
            "tenure-server",
            "tenure-storage",
            "tenure-transport",
            "openraft",
            "rocksdb",
            "librocksdb-sys",
            "axum",
        ],
    );
}

#[test]
fn tenure_loadgen_sees_tenure_only_as_a_client() {
    // The load generator measures tenure the way it measures etcd: through client libraries.
    assert_tree_excludes(
        "tenure-loadgen",
        "tenure-client",
        &[
            "tenure-server",
            "tenure-storage",
            "tenure-transport",
            "openraft",
            "rocksdb",
            "librocksdb-sys",
        ],
    );
}

/// Import cycles among a crate's top-level modules that are known and not yet taken apart, with
/// the reason. The test fails on any other cycle, and on a listed one that no longer exists (so
/// the list only shrinks).
/// (Empty: tenure-client's client/lease/renewer cycle was taken apart by a lower `handle`
/// module and a higher `connect` module.)
const KNOWN_MODULE_CYCLES: &[(&str, &[&str])] = &[];

/// `text` without comments (a `//` at the start of a line or after whitespace, so `"http://"`
/// stays) and without its unit-test modules (`#[cfg(test)]`, other attributes, `mod x { ... }`).
fn code_outside_comments_and_tests(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    for line in text.lines() {
        let cut = line
            .match_indices("//")
            .find(|(at, _)| *at == 0 || line[..*at].ends_with(char::is_whitespace))
            .map_or(line.len(), |(at, _)| at);
        code.push_str(&line[..cut]);
        code.push('\n');
    }
    let mut kept = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        // Further attributes, then `mod name {`: skip to the matching brace.
        let mut tail = after.trim_start();
        while tail.starts_with("#[") {
            tail = tail
                .find(']')
                .map_or("", |end| tail[end + 1..].trim_start());
        }
        let Some(module) = tail.strip_prefix("mod ") else {
            rest = after;
            continue;
        };
        let Some(open) = module.find(&['{', ';'][..]) else {
            rest = after;
            continue;
        };
        if module.as_bytes()[open] == b';' {
            rest = &module[open + 1..];
            continue;
        }
        let mut depth = 0usize;
        let mut end = module.len();
        for (i, c) in module[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &module[end..];
    }
    kept.push_str(rest);
    kept
}

/// The names a piece of code reaches through `crate::` (`crate::x` paths and the top-level items
/// of `use crate::{x, y::z}` groups).
fn crate_references(code: &str) -> std::collections::BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = std::collections::BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        names.insert(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(after));
        }
        rest = after;
    }
    names
}

/// The items a crate root re-exports from its modules (`pub use m::{A, B};`, `pub use m::A;`),
/// by item name: `crate::A` reaches module `m`.
fn root_reexports(root: &str) -> std::collections::BTreeMap<String, String> {
    let mut items = std::collections::BTreeMap::new();
    let mut rest = root;
    while let Some(at) = rest.find("pub use ") {
        let statement = &rest[at + "pub use ".len()..];
        let end = statement.find(';').unwrap_or(statement.len());
        let statement = &statement[..end];
        if let Some((module, named)) = statement.split_once("::") {
            let module = module.trim();
            // Each re-exported path's last segment (or its `as` name) is the item's name.
            let named = named.trim().trim_start_matches('{').trim_end_matches('}');
            for path in named.split(',') {
                let name = match path.split_once(" as ") {
                    Some((_, alias)) => alias.trim(),
                    None => path.rsplit("::").next().unwrap_or("").trim(),
                };
                if !name.is_empty() && name != "self" && name != "*" {
                    items.insert(name.to_owned(), module.to_owned());
                }
            }
        }
        rest = &rest[at + "pub use ".len() + end..];
    }
    items
}

/// The dependency graph of one crate's top-level modules (`lib.rs`, `main.rs` and `bin/` are
/// the crate's roots, not modules; a module's `tests.rs` is its unit tests). A reference to an
/// item the root re-exports counts as one to the module it comes from.
fn module_graph(
    src: &Path,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut files = Vec::new();
    rust_sources(src, &mut files);
    let mut root = String::new();
    let mut modules: std::collections::BTreeMap<String, Vec<std::path::PathBuf>> =
        std::collections::BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).expect("under src");
        let first = relative
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        let module = first.trim_end_matches(".rs").to_owned();
        if matches!(module.as_str(), "lib" | "main") {
            root.push_str(&std::fs::read_to_string(&file).expect("read source"));
            continue;
        }
        if module == "bin" || file.file_name().is_some_and(|name| name == "tests.rs") {
            continue;
        }
        modules.entry(module).or_default().push(file);
    }
    let reexports = root_reexports(&code_outside_comments_and_tests(&root));
    let names: std::collections::BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .into_iter()
        .map(|(module, files)| {
            let mut uses = std::collections::BTreeSet::new();
            for file in files {
                let text = std::fs::read_to_string(&file).expect("read source");
                for name in crate_references(&code_outside_comments_and_tests(&text)) {
                    // A module's own name stays its own (a root `pub use other::module` must not
                    // hide it).
                    let name = match reexports.get(&name) {
                        Some(module) if !names.contains(&name) => module.clone(),
                        _ => name,
                    };
                    if name != module && names.contains(&name) {
                        uses.insert(name);
                    }
                }
            }
            (module, uses)
        })
        .collect()
}

/// The modules of `graph` on a cycle, grouped by cycle (strongly connected sets of two or more).
fn module_cycles(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    let reachable = |from: &str| -> std::collections::BTreeSet<String> {
        let mut seen = std::collections::BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(module) = stack.pop() {
            for next in graph.get(&module).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: std::collections::BTreeMap<&String, std::collections::BTreeSet<String>> =
        graph.keys().map(|m| (m, reachable(m))).collect();
    let mut cycles: Vec<Vec<String>> = Vec::new();
    for module in graph.keys() {
        if !reach[module].contains(module) || cycles.iter().any(|c| c.contains(module)) {
            continue;
        }
        let cycle: Vec<String> = graph
            .keys()
            .filter(|other| reach[module].contains(*other) && reach[*other].contains(module))
            .cloned()
            .collect();
        cycles.push(cycle);
    }
    cycles
}

#[test]
fn no_module_import_cycles_within_a_crate() {
    let root = workspace_root();
    let mut crates: Vec<String> = std::fs::read_dir(root.join("crates"))
        .expect("read crates")
        .map(|entry| {
            format!(
                "crates/{}",
                entry.expect("entry").file_name().to_string_lossy()
            )
        })
        .collect();
    crates.extend(["loadgen", "tests", "bench"].map(str::to_owned));
    crates.sort();
    let mut unexpected = Vec::new();
    let mut found_known = Vec::new();
    let mut modules_seen = 0;
    for krate in &crates {
        let src = root.join(krate).join("src");
        if !src.is_dir() {
            continue;
        }
        let graph = module_graph(&src);
        modules_seen += graph.len();
        for cycle in module_cycles(&graph) {
            let known = KNOWN_MODULE_CYCLES
                .iter()
                .any(|(name, modules)| name == krate && *modules == cycle.as_slice());
            if known {
                found_known.push((krate.clone(), cycle));
            } else {
                unexpected.push(format!("{krate}: {}", cycle.join(" <-> ")));
            }
        }
    }
    assert!(modules_seen > 50, "scanned only {modules_seen} modules");
    assert!(
        unexpected.is_empty(),
        "module import cycles (a module must not reach itself through `crate::` paths):\n{}",
        unexpected.join("\n")
    );
    for (name, modules) in KNOWN_MODULE_CYCLES {
        assert!(
            found_known
                .iter()
                .any(|(krate, cycle)| krate == name && cycle.as_slice() == *modules),
            "{name}: the cycle {modules:?} is gone; remove it from KNOWN_MODULE_CYCLES"
        );
    }
}

#[test]
fn the_cycle_finder_sees_a_cycle_and_ignores_comments_and_unit_tests() {
    let code = code_outside_comments_and_tests(
        "use crate::{a, b::{c, d}, e::f};\nfn x() { crate::g::h(\"http://x\"); crate::Item; }\n\
         // crate::comment\nlet y = 1; // crate::trailing\n#[cfg(test)]\n#[allow(x)]\n\
         mod tests { use crate::t; fn z() { {} } }\nfn after() { crate::k(); }",
    );
    let refs: Vec<String> = crate_references(&code).into_iter().collect();
    assert_eq!(refs, ["Item", "a", "b", "e", "g", "k"]);
    let reexports = root_reexports(
        "pub use item::{Item, Other as Renamed};\npub use single::One;\npub use dep::client::Thing;",
    );
    assert_eq!(reexports.get("Item").map(String::as_str), Some("item"));
    assert_eq!(reexports.get("Renamed").map(String::as_str), Some("item"));
    assert_eq!(reexports.get("One").map(String::as_str), Some("single"));
    assert_eq!(reexports.get("Thing").map(String::as_str), Some("dep"));
    assert_eq!(reexports.get("client"), None);
    let graph = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_owned(), [to.to_owned()].into_iter().collect()))
        .collect();
    assert_eq!(module_cycles(&graph), vec![vec!["a", "b", "c"]]);
}
