//! Which entities the resources file manages: the file is applied at every start, so an edit made
//! through the admin API or the console to one of them is undone at the next start. The admin API
//! marks them (`"managed_by": "resources_file"`) and the console warns before such an edit.
//!
//! The set is this process's: it holds what the file given to this gateway declared. A gateway
//! started without a resources file marks nothing, since nothing will undo an edit then.

use std::collections::HashSet;

/// The kinds of entity a resources file declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Workspace,
    Department,
    Member,
    ApiKey,
    Upstream,
    Model,
    Policy,
}

/// The entities (by kind and id) the resources file applied at start declares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Managed(HashSet<(Kind, i64)>);

impl Managed {
    /// Marks one entity as declared by the file.
    pub fn insert(&mut self, kind: Kind, id: i64) {
        self.0.insert((kind, id));
    }

    /// `"resources_file"` for an entity the file declares (the admin API's `managed_by`), else
    /// `None`.
    pub fn by(&self, kind: Kind, id: i64) -> Option<&'static str> {
        self.0.contains(&(kind, id)).then_some("resources_file")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_only_what_was_declared() {
        let mut m = Managed::default();
        m.insert(Kind::Member, 7);
        assert_eq!(m.by(Kind::Member, 7), Some("resources_file"));
        assert_eq!(m.by(Kind::ApiKey, 7), None, "same id, other kind");
        assert_eq!(m.by(Kind::Member, 8), None);
        assert_eq!(
            Managed::default().by(Kind::Member, 7),
            None,
            "nothing marked by default"
        );
    }
}
