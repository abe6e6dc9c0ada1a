//! Retention in the file store: one listing of every run's meta, the
//! policy's choice, then each chosen run removed under its lock if it did
//! not change meanwhile: its directory renamed into the trash (both
//! directories synced, so a power cut leaves it whole or gone), then
//! deleted. Trash a crash left behind goes at the next prune.

use std::path::Path;
use std::sync::atomic::Ordering;

use super::{Inner, TRASH, io};
use crate::archive::retention::{Candidate, Planner};
use crate::archive::{PruneReport, RetentionPolicy, RunKey, StoreError};
use crate::atomic_file;

impl Inner {
    /// Lists every run once (its meta only), then removes what the policy
    /// chose.
    pub(super) fn prune(&self, policy: &RetentionPolicy, now_ms: u64) -> Result<PruneReport, StoreError> {
        let mut planner = Planner::new(policy, now_ms);
        let entries = std::fs::read_dir(&self.root).map_err(io(format!("listing {}", self.root.display())))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TRASH) {
                self.empty_trash(&entry.path());
                continue;
            }
            if name.starts_with('.') {
                continue;
            }
            let runs = match std::fs::read_dir(entry.path()) {
                Ok(runs) => runs,
                Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(format!("listing {}", entry.path().display()))(e)),
            };
            for run in runs.flatten() {
                match self.read_meta(&run.path()) {
                    // Only a run in the folder its names make (the meta
                    // holds them whole; a folder name may be hashed).
                    Ok(Some(meta)) => match RunKey::new(&meta.fqn, &meta.run) {
                        Ok(key) if self.dir(&key) == run.path() => planner.offer(&key, &meta.info),
                        _ => {}
                    },
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(path = %run.path().display(), error = %e, "retention skips a run it cannot read")
                    }
                }
            }
        }
        let (chosen, mut report) = planner.finish();
        for candidate in chosen {
            let removed = self.remove_if_unchanged(&candidate);
            report.record(&candidate, removed);
        }
        Ok(report)
    }

    /// Under the run's lock: if its meta is still the candidate's, moves
    /// the run's directory to the trash (one rename), then deletes it.
    pub(super) fn remove_if_unchanged(&self, candidate: &Candidate) -> Result<bool, StoreError> {
        let dir = self.dir(&candidate.run);
        let seq = self.trash_seq.fetch_add(1, Ordering::Relaxed);
        let trash = self.root.join(format!("{TRASH}{}-{seq}", (self.clock)()));
        {
            let _guard = self.lock(&candidate.run);
            match self.run_meta(&candidate.run, &dir)? {
                Some(meta) if meta.info == candidate.info => {}
                _ => return Ok(false),
            }
            std::fs::rename(&dir, &trash).map_err(io(format!("moving {} to {}", dir.display(), trash.display())))?;
            // The run is gone whole or there whole after a power cut, never
            // there with some of its files deleted.
            // Both directories the rename changed are synced.
            if self.fsync {
                for changed in [Some(self.root.as_path()), dir.parent()].into_iter().flatten() {
                    atomic_file::sync_dir(changed).map_err(io(format!("syncing {}", changed.display())))?;
                }
            }
        }
        self.empty_trash(&trash);
        if let Some(pipeline) = dir.parent() {
            // Fails, as it should, while the pipeline has runs left.
            let _ = std::fs::remove_dir(pipeline);
        }
        Ok(true)
    }

    /// Deletes a removed run's directory; what fails stays for the next prune.
    pub(super) fn empty_trash(&self, trash: &Path) {
        if let Err(e) = std::fs::remove_dir_all(trash)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %trash.display(), error = %e, "retention could not delete a removed run yet");
        }
    }
}
