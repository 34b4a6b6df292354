//! The lineage graph laid out in layers, left to right (inputs → dependency →
//! produced asset), for the web UI. The layering, crossing reduction and
//! coordinates are `rust-sugiyama`'s (Sugiyama's method: Gansner et al.'s ranks,
//! weighted-median ordering, Brandes–Köpf coordinates); this module only maps ids
//! to its vertex numbers, turns its top-down layers into columns, and stacks the
//! disconnected parts of the graph one under another.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rust_sugiyama::configure::Config;

/// Pixels between two columns (layers) and between two rows (nodes of a layer).
pub const COLUMN: f64 = 300.0;
pub const ROW: f64 = 56.0;
/// Between two disconnected parts of the graph.
const PART_GAP: f64 = 2.0 * ROW;
/// The library's spacing of the nodes of one layer: one row.
const SPACING: f64 = 10.0;

/// Where each node goes (its centre, in pixels), and the size of the whole.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placed {
    pub at: BTreeMap<String, (f64, f64)>,
    pub width: f64,
    pub height: f64,
}

/// Lays out `nodes` with `edges` (from → to, both among `nodes`; others are
/// ignored). A node without edges is a part of its own.
pub fn layered(nodes: &[String], edges: &[(String, String)]) -> Placed {
    let number: HashMap<&str, u32> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i as u32))
        .collect();
    let vertices: Vec<(u32, (f64, f64))> = (0..nodes.len() as u32)
        .map(|i| (i, (SPACING, SPACING)))
        .collect();
    let mut pairs: Vec<(u32, u32)> = edges
        .iter()
        .filter_map(|(a, b)| Some((*number.get(a.as_str())?, *number.get(b.as_str())?)))
        .filter(|(a, b)| a != b)
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    let config = Config {
        vertex_spacing: SPACING,
        ..Config::default()
    };
    let parts = rust_sugiyama::from_vertices_and_edges(&vertices, &pairs, &config);
    let mut placed = Placed::default();
    let mut top = 0.0;
    for (part, _, _) in parts {
        // The library's y is the layer (top-down): here it is the column.
        let mut layers: Vec<f64> = part.iter().map(|(_, (_, y))| *y).collect();
        layers.sort_by(f64::total_cmp);
        layers.dedup();
        let min_x = part
            .iter()
            .map(|(_, (x, _))| *x)
            .fold(f64::INFINITY, f64::min);
        let mut bottom = top;
        for (vertex, (x, y)) in part {
            let Some(id) = nodes.get(vertex) else {
                continue;
            };
            let column = layers.partition_point(|l| *l < y) as f64;
            let at = (
                COLUMN / 2.0 + column * COLUMN,
                top + ROW / 2.0 + (x - min_x) / SPACING * ROW,
            );
            placed.width = placed.width.max(at.0 + COLUMN / 2.0);
            bottom = f64::max(bottom, at.1 + ROW / 2.0);
            placed.at.insert(id.clone(), at);
        }
        top = bottom + PART_GAP;
    }
    placed.height = (top - PART_GAP).max(0.0);
    placed
}

/// The last layout, by the graph it was made for: a state change moves no node,
/// so only a changed set of nodes or edges is laid out again (off the async
/// threads: 6,000 nodes take about 0.6 s in a release build).
#[derive(Default)]
pub struct Cache {
    last: tokio::sync::Mutex<Option<(u64, Arc<Placed>)>>,
}

impl Cache {
    pub async fn place(
        &self,
        nodes: Vec<String>,
        edges: Vec<(String, String)>,
    ) -> Result<Arc<Placed>, LayoutFailed> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&nodes, &edges).hash(&mut h);
        let key = h.finish();
        let mut last = self.last.lock().await;
        if let Some((k, placed)) = last.as_ref()
            && *k == key
        {
            return Ok(placed.clone());
        }
        let placed = Arc::new(
            tokio::task::spawn_blocking(move || layered(&nodes, &edges))
                .await
                .map_err(|e| LayoutFailed(e.to_string()))?,
        );
        *last = Some((key, placed.clone()));
        Ok(placed)
    }
}

/// The layout library gave up on a graph (the answer is a 503 that says so).
#[derive(Debug, thiserror::Error)]
#[error("laying out the lineage graph failed: {0}")]
pub struct LayoutFailed(String);

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn edge(a: &str, b: &str) -> (String, String) {
        (a.to_owned(), b.to_owned())
    }

    #[test]
    fn inputs_dependencies_and_products_are_columns_left_to_right() {
        // The GMV cascade: two ODS tables → dwd → dws → ads.
        let nodes = ids(&[
            "ods.order",
            "ods.payment",
            "dep.dwd",
            "dwd",
            "dep.dws",
            "dws",
            "dep.ads",
            "ads",
            "lonely",
        ]);
        let edges = [
            edge("ods.order", "dep.dwd"),
            edge("ods.payment", "dep.dwd"),
            edge("dep.dwd", "dwd"),
            edge("dwd", "dep.dws"),
            edge("dep.dws", "dws"),
            edge("dws", "dep.ads"),
            edge("dep.ads", "ads"),
        ];
        let p = layered(&nodes, &edges);
        assert_eq!(p.at.len(), nodes.len(), "every node placed");
        let x = |n: &str| p.at[n].0;
        assert_eq!(
            x("ods.order"),
            x("ods.payment"),
            "the inputs share a column"
        );
        for (a, b) in edges.iter().map(|(a, b)| (a.as_str(), b.as_str())) {
            assert!(x(a) < x(b), "{a} left of {b}: {p:?}");
        }
        assert_ne!(p.at["ods.order"].1, p.at["ods.payment"].1, "one row each");
        let lonely = p.at["lonely"];
        let max_y =
            p.at.iter()
                .filter(|(k, _)| *k != "lonely")
                .map(|(_, a)| a.1)
                .fold(0.0, f64::max);
        assert!(
            lonely.1 > max_y || lonely.1 < p.at["ods.order"].1,
            "a part of its own"
        );
        assert!(p.width >= x("ads") && p.height >= max_y);
    }

    #[test]
    fn an_empty_or_looping_graph_is_no_trouble() {
        assert_eq!(layered(&[], &[]), Placed::default());
        let p = layered(
            &ids(&["a", "b"]),
            &[edge("a", "b"), edge("b", "a"), edge("a", "a")],
        );
        assert_eq!(p.at.len(), 2);
    }
}
