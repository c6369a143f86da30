//! The values of the SQL both backends run as written: parameters typed
//! even when NULL (PostgreSQL types every parameter), and the cells of a
//! row read back, checked when they are taken.

/// A statement's parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    Int(Option<i64>),
    Text(Option<String>),
}

impl From<i64> for Param {
    fn from(v: i64) -> Param {
        Param::Int(Some(v))
    }
}

impl From<Option<i64>> for Param {
    fn from(v: Option<i64>) -> Param {
        Param::Int(v)
    }
}

impl From<&str> for Param {
    fn from(v: &str) -> Param {
        Param::Text(Some(v.to_string()))
    }
}

impl From<Option<&str>> for Param {
    fn from(v: Option<&str>) -> Param {
        Param::Text(v.map(str::to_string))
    }
}

impl From<String> for Param {
    fn from(v: String) -> Param {
        Param::Text(Some(v))
    }
}

/// A cell of a row read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
}

/// Column `i` of `row` as text.
pub fn text(row: &[Cell], i: usize) -> Result<String, String> {
    match row.get(i) {
        Some(Cell::Text(s)) => Ok(s.clone()),
        other => Err(unexpected(i, "text", other)),
    }
}

/// Column `i` of `row` as an integer.
pub fn int(row: &[Cell], i: usize) -> Result<i64, String> {
    match row.get(i) {
        Some(Cell::Int(v)) => Ok(*v),
        other => Err(unexpected(i, "an integer", other)),
    }
}

/// Column `i` of `row` as an integer or NULL.
pub fn maybe_int(row: &[Cell], i: usize) -> Result<Option<i64>, String> {
    match row.get(i) {
        Some(Cell::Null) => Ok(None),
        _ => int(row, i).map(Some),
    }
}

fn unexpected(i: usize, wanted: &str, got: Option<&Cell>) -> String {
    format!("column {i} of a row read back is {got:?}, not {wanted}; this is a bug in kubexm")
}
