//! Reading YAML with positions.
//!
//! serde derive stops at the first error and forgets where a value came from.
//! Validation must report every problem at once with its line and column, so
//! the document is read in two passes over one parse:
//!
//! 1. serde-saphyr parses the text into a tree whose every key and value is
//!    `Spanned` (its budget guards against alias bombs and deep nesting);
//! 2. the tree becomes a `serde_json::Value` plus an index from each YAML path
//!    (`spec.hosts[1].address`, the same spelling `serde_path_to_error`
//!    prints) to the position of that key or item.
//!
//! Typed deserialization then runs over the `Value`, and every error or rule
//! that knows a path can ask the index where it is.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// A 1-based line and column in the source file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

impl Pos {
    fn of<T>(s: &Spanned<T>) -> Pos {
        Pos {
            line: s.referenced.line() as u32,
            column: s.referenced.column() as u32,
        }
    }
}

/// A parsed YAML document: its data and where each path sits in the text.
#[derive(Debug, Clone)]
pub struct Located {
    pub value: serde_json::Value,
    positions: BTreeMap<String, Pos>,
}

impl Located {
    /// Position of a path, or of its nearest ancestor that has one.
    pub fn pos(&self, path: &str) -> Option<Pos> {
        let mut p = path;
        loop {
            if let Some(pos) = self.positions.get(p) {
                return Some(*pos);
            }
            if p.is_empty() {
                return None;
            }
            p = p.rfind(['.', '[']).map_or("", |cut| &p[..cut]);
        }
    }

    /// Removes the value at `path` (a map key), so typed reading can go on
    /// past a key that was already reported.
    pub(crate) fn remove(&mut self, path: &str) -> bool {
        let Some((parent, key)) = split_last(path) else {
            return false;
        };
        let mut node = &mut self.value;
        for seg in segments(parent) {
            node = match (seg, node) {
                (Seg::Key(k), serde_json::Value::Object(m)) => match m.get_mut(k) {
                    Some(n) => n,
                    None => return false,
                },
                (Seg::Index(i), serde_json::Value::Array(a)) => match a.get_mut(i) {
                    Some(n) => n,
                    None => return false,
                },
                _ => return false,
            };
        }
        match node {
            serde_json::Value::Object(m) => m.shift_remove(key).is_some(),
            _ => false,
        }
    }
}

enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

fn segments(path: &str) -> impl Iterator<Item = Seg<'_>> {
    path.split('.').filter(|s| !s.is_empty()).flat_map(|part| {
        let (key, rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        let key = (!key.is_empty()).then_some(Seg::Key(key));
        let idx = rest
            .split(['[', ']'])
            .filter(|s| !s.is_empty())
            .filter_map(|s| s.parse().ok())
            .map(Seg::Index);
        key.into_iter().chain(idx)
    })
}

fn split_last(path: &str) -> Option<(&str, &str)> {
    match path.rfind('.') {
        Some(i) => Some((&path[..i], &path[i + 1..])),
        None if !path.is_empty() && !path.contains('[') => Some(("", path)),
        None => None,
    }
}

/// The error serde-saphyr gives for text that is not YAML, or breaks a budget.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SyntaxError {
    pub message: String,
    pub pos: Option<Pos>,
}

/// Parses YAML text into a [`Located`] document.
pub fn parse(text: &str) -> Result<Located, SyntaxError> {
    let root: Spanned<Node> = serde_saphyr::from_str(text).map_err(|e| SyntaxError {
        pos: e.location().map(|l| Pos {
            line: l.line() as u32,
            column: l.column() as u32,
        }),
        message: first_line(&e.to_string()),
    })?;
    let mut positions = BTreeMap::new();
    let value = flatten(root, String::new(), &mut positions);
    Ok(Located { value, positions })
}

/// serde-saphyr renders a source snippet under its message; we print our
/// own position, so only the message's first line is kept.
fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or(s).trim();
    let line = line.strip_prefix("error: ").unwrap_or(line);
    // "line 2 column 7: unclosed bracket" → "unclosed bracket": the position is printed separately.
    match line.strip_prefix("line ").and_then(|r| r.split_once(": ")) {
        Some((pos, rest)) if pos.contains(" column ") => rest.to_string(),
        _ => line.to_string(),
    }
}

fn flatten(node: Spanned<Node>, path: String, positions: &mut BTreeMap<String, Pos>) -> serde_json::Value {
    use serde_json::Value;
    let pos = Pos::of(&node);
    positions.entry(path.clone()).or_insert(pos);
    match node.value {
        Node::Null => Value::Null,
        Node::Bool(b) => Value::Bool(b),
        Node::Int(i) => Value::from(i),
        Node::UInt(u) => Value::from(u),
        Node::Float(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        Node::Str(s) => Value::String(s),
        Node::Seq(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| flatten(item, format!("{path}[{i}]"), positions))
                .collect(),
        ),
        Node::Map(entries) => {
            let mut map = serde_json::Map::new();
            for (key, value) in entries {
                let name = key.value.as_key();
                let child = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
                // A key's own position is where errors about it should point.
                positions.insert(child.clone(), Pos::of(&key));
                let v = flatten(value, child, positions);
                map.insert(name, v);
            }
            Value::Object(map)
        }
    }
}

/// Any YAML node, as serde-saphyr hands it over.
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<Node>, Spanned<Node>)>),
}

impl Node {
    fn as_key(&self) -> String {
        match self {
            Node::Null => "null".into(),
            Node::Bool(b) => b.to_string(),
            Node::Int(i) => i.to_string(),
            Node::UInt(u) => u.to_string(),
            Node::Float(f) => f.to_string(),
            Node::Str(s) => s.clone(),
            Node::Seq(_) | Node::Map(_) => "<complex key>".into(),
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Ok(Node::UInt(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Node::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_point_at_keys_and_items() {
        let doc = parse("a:\n  b: 1\n  list:\n    - x: 2\n    - y\n").unwrap();
        assert_eq!(doc.pos("a.b"), Some(Pos { line: 2, column: 3 }));
        assert_eq!(doc.pos("a.list[0].x"), Some(Pos { line: 4, column: 7 }));
        assert_eq!(doc.pos("a.list[1]"), Some(Pos { line: 5, column: 7 }));
        // Unknown deeper paths fall back to the nearest ancestor.
        assert_eq!(doc.pos("a.list[0].x.zzz"), Some(Pos { line: 4, column: 7 }));
    }

    #[test]
    fn remove_drops_a_nested_key() {
        let mut doc = parse("a:\n  list:\n    - x: 2\n      z: 3\n").unwrap();
        assert!(doc.remove("a.list[0].z"));
        assert_eq!(doc.value, serde_json::json!({"a": {"list": [{"x": 2}]}}));
    }
}
