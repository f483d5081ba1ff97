//! The listable schema of a turn state: one [`FieldSpec`] per leaf field.

use std::fmt::Write as _;

/// When a field's value is set and whether it outlives the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// Set by the caller at turn start.
    Input,
    /// Re-fetched from the memory store every turn; never persisted.
    Loaded,
    /// Persisted through the checkpointer and folded by its reducer.
    Reducer,
    /// Reset at turn start; never persisted.
    TurnScoped,
}

impl Lifecycle {
    /// The name used in docs: `input`, `loaded`, `reducer`, `turn-scoped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Input => "input",
            Lifecycle::Loaded => "loaded",
            Lifecycle::Reducer => "reducer",
            Lifecycle::TurnScoped => "turn-scoped",
        }
    }

    /// True when the field is kept in the checkpoint.
    pub fn is_persisted(self) -> bool {
        self == Lifecycle::Reducer
    }
}

/// How the writes of one step fold into a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reducer {
    /// List concatenation, in merge order; persisted one entry at a time.
    Append,
    /// Key-wise merge that keeps sibling keys; later writers win per key.
    Merge,
    /// One writer per step; a second writer in the same step is an error.
    LastValue,
}

impl Reducer {
    /// The name used in docs: `append`, `merge`, `last-value`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reducer::Append => "append",
            Reducer::Merge => "merge",
            Reducer::LastValue => "last-value",
        }
    }

    #[doc(hidden)]
    pub const fn __from_ident(ident: &str) -> Reducer {
        match ident.as_bytes() {
            b"append" => Reducer::Append,
            b"merge" => Reducer::Merge,
            b"window" => Reducer::Append,
            _ => Reducer::LastValue,
        }
    }
}

/// One leaf field of a turn state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FieldSpec {
    /// The field's name (dotted for leaves of a group, e.g.
    /// `memory_control.pending_action`); also its key in checkpoints.
    pub name: &'static str,
    /// The Rust type, as written in the declaration.
    pub ty: &'static str,
    /// When it is set and whether it outlives the turn.
    pub lifecycle: Lifecycle,
    /// How writes fold; `None` for input fields, which stages never write.
    pub reducer: Option<Reducer>,
    /// For a window over another list: the source field and how many of
    /// its last entries it holds.
    pub view_of: Option<(&'static str, usize)>,
    /// Who writes it.
    pub writers: &'static [&'static str],
    /// What it holds, one line per doc line.
    pub doc: &'static [&'static str],
}

/// A turn state's fields, in declaration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Schema {
    /// The state type's name.
    pub name: &'static str,
    /// Every leaf field.
    pub fields: &'static [FieldSpec],
}

impl Schema {
    /// The field named `name`.
    pub fn field(&self, name: &str) -> Option<&FieldSpec> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The fields with lifecycle `lifecycle`.
    pub fn with_lifecycle(&self, lifecycle: Lifecycle) -> impl Iterator<Item = &FieldSpec> {
        self.fields.iter().filter(move |f| f.lifecycle == lifecycle)
    }

    /// The field table for the docs: a Markdown table with one row per
    /// field (name, type, lifecycle, reducer, writers, description).
    pub fn to_markdown(&self) -> String {
        let mut out =
            String::from("| field | type | lifecycle | reducer | written by | description |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        for f in self.fields {
            let doc = f
                .doc
                .iter()
                .map(|l| l.trim())
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(
                out,
                "| `{}` | `{}` | {} | {} | {} | {} |",
                f.name,
                f.ty.replace('|', "\\|"),
                f.lifecycle.as_str(),
                match (f.reducer, f.view_of) {
                    (_, Some((source, last))) => format!("window: last {last} of `{source}`"),
                    (Some(r), None) => r.as_str().to_owned(),
                    (None, None) => "—".to_owned(),
                },
                f.writers.join(", "),
                doc.replace('|', "\\|"),
            );
        }
        out
    }
}
