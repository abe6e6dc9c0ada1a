//! `[diagnostics]`: what a node records for checking it from outside.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[diagnostics]`. Off by default: both keys unset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiagnosticsSection {
    /// The namespace whose every delivered event the audit log records
    /// (an implicit subscription). Unset (the default): no audit log.
    pub audit_namespace: Option<String>,
    /// The file the audit log appends its JSON lines to (see
    /// [`crate::archive::AuditLog`]). Needed with `audit_namespace`.
    pub audit_path: Option<PathBuf>,
}

impl DiagnosticsSection {
    /// The audit log's namespace and file, if it is on.
    pub fn audit(&self) -> Option<(&str, &std::path::Path)> {
        Some((self.audit_namespace.as_deref()?, self.audit_path.as_deref()?))
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        match (&self.audit_namespace, &self.audit_path) {
            (Some(_), None) => {
                Err("diagnostics.audit_namespace needs diagnostics.audit_path (the file to append to)".into())
            }
            (None, Some(_)) => {
                Err("diagnostics.audit_path needs diagnostics.audit_namespace (the namespace to audit)".into())
            }
            (Some(namespace), _) if namespace.is_empty() => Err("diagnostics.audit_namespace must not be empty".into()),
            (_, Some(path)) if path.as_os_str().is_empty() => Err("diagnostics.audit_path must not be empty".into()),
            _ => Ok(()),
        }
    }
}
