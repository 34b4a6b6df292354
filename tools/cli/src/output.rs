//! How answers are shown: a table for people (the default), JSON or YAML for
//! scripts (`-o json|yaml`: the API's answer as it came), and explain's tree.

use std::io::IsTerminal;

use serde_json::Value;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
}

/// Prints `value` as JSON or YAML; `false` when the format is a table (the caller
/// draws it).
pub fn structured(format: Format, value: &Value) -> bool {
    match format {
        Format::Table => false,
        Format::Json => {
            println!(
                "{}",
                serde_json::to_string_pretty(value).unwrap_or_default()
            );
            true
        }
        Format::Yaml => {
            print!("{}", serde_norway::to_string(value).unwrap_or_default());
            true
        }
    }
}

/// A column: its header and where its value is in an item (`a.b` for nesting).
pub struct Column {
    pub header: &'static str,
    pub path: &'static str,
}

pub const fn col(header: &'static str, path: &'static str) -> Column {
    Column { header, path }
}

fn cell(item: &Value, path: &str) -> String {
    let v = path.split('.').fold(item, |v, k| &v[k]);
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

/// Left-aligned columns, kubectl-style: upper-case headers, two spaces apart.
pub fn table(items: &[Value], columns: &[Column]) {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| columns.iter().map(|c| cell(i, c.path)).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(n, c)| {
            rows.iter()
                .map(|r| r[n].chars().count())
                .chain([c.header.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (n, c) in cells.iter().enumerate() {
            if n + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[n]));
            }
        }
        emit(out.trim_end());
    };
    line(columns.iter().map(|c| c.header.to_owned()).collect());
    for r in rows {
        line(r);
    }
}

/// Prints a line; a reader that went away (`sluice acls | head`) ends the
/// program quietly, as it does for other Unix tools, instead of a panic.
pub fn emit(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}")
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}

/// Colour only on a terminal.
struct Paint(bool);

impl Paint {
    fn wrap(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\u{1b}[{code}m{s}\u{1b}[0m")
        } else {
            s.to_owned()
        }
    }
}

/// Explain as a tree: the summary, then each node with ✓ or ✗; the blocking
/// leaves (unmet checks) are marked and, on a terminal, red.
pub fn explain(e: &Value) {
    let paint = Paint(std::io::stdout().is_terminal());
    let status = e["status"].as_str().unwrap_or("?");
    let paused = if e["paused"] == Value::Bool(true) {
        " (paused)"
    } else {
        ""
    };
    println!(
        "{} v{} [{}]: {}{paused}",
        e["dependency_id"].as_str().unwrap_or("?"),
        e["version"],
        e["mode"].as_str().unwrap_or("?"),
        paint.wrap(if status == "waiting" { "33" } else { "32" }, status)
    );
    println!("  {}", e["summary"].as_str().unwrap_or_default());
    node(&e["condition"], 1, &paint);
    if let Some(key) = e["next_trigger_key"].as_str() {
        println!("  next trigger: {key}");
    }
    if let Some(key) = e["last_trigger_key"].as_str() {
        println!("  last trigger: {key}");
    }
    if let Some(at) = e["timers"]["fire_at_ms"].as_i64() {
        let now = e["now_ms"].as_i64().unwrap_or(at);
        println!("  fires at {at} ({} ms from now)", at - now);
    }
    if let Some(parts) = e["partitions"].as_object() {
        println!(
            "  partitions: {} pending, {} ready",
            parts.get("pending").unwrap_or(&Value::Null),
            parts.get("ready").unwrap_or(&Value::Null)
        );
    }
}

fn node(n: &Value, depth: usize, paint: &Paint) {
    let pad = "  ".repeat(depth);
    let mark = |ok: bool| {
        if ok {
            paint.wrap("32", "✓")
        } else {
            paint.wrap("31", "✗")
        }
    };
    let ok = n["satisfied"] == Value::Bool(true);
    match n["node"].as_str() {
        Some(kind @ ("all" | "any")) => {
            println!("{pad}{} {kind} of", mark(ok));
            for c in n["children"].as_array().into_iter().flatten() {
                node(c, depth + 1, paint);
            }
        }
        Some("input") => {
            println!("{pad}{} {}", mark(ok), n["asset"].as_str().unwrap_or("?"));
            for c in n["checks"].as_array().into_iter().flatten() {
                let good = c["satisfied"] == Value::Bool(true);
                let line = format!(
                    "{}: {}",
                    c["predicate"].as_str().unwrap_or("?"),
                    c["reason"].as_str().unwrap_or_default()
                );
                let line = if good {
                    line
                } else {
                    paint.wrap("31", &format!("{line}   ← blocks"))
                };
                println!("{pad}    {} {line}", mark(good));
            }
        }
        _ => println!("{pad}{n}"),
    }
}

/// A backfill's progress in one line.
pub fn progress(b: &Value) -> String {
    let p = &b["progress"];
    let n = |k: &str| p[k].as_i64().unwrap_or(0);
    let mut line = format!(
        "{}/{} succeeded, {} running, {} pending",
        n("succeeded"),
        n("total"),
        n("running"),
        n("pending")
    );
    for k in ["failed", "cancelled"] {
        if n(k) > 0 {
            line.push_str(&format!(", {} {k}", n(k)));
        }
    }
    line
}

/// Polls a backfill until it is no longer running: a bar redrawn in place on a
/// terminal, a line per change otherwise. Returns its last state.
pub async fn follow<F, Fut, E>(mut get: F) -> Result<Value, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Value, E>>,
{
    let tty = std::io::stderr().is_terminal();
    let mut shown = String::new();
    loop {
        let b = get().await?;
        let p = &b["progress"];
        let total = p["total"].as_i64().unwrap_or(0).max(1);
        let ended = ["succeeded", "failed", "cancelled"]
            .iter()
            .map(|k| p[*k].as_i64().unwrap_or(0))
            .sum::<i64>();
        let line = progress(&b);
        if tty {
            let filled = (ended * 30 / total) as usize;
            eprint!(
                "\r[{}{}] {line}  ",
                "#".repeat(filled),
                "-".repeat(30 - filled.min(30))
            );
        } else if line != shown {
            eprintln!("{line}");
        }
        shown = line;
        if b["state"] != "running" {
            if tty {
                eprintln!();
            }
            return Ok(b);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
