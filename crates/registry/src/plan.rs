//! The decisions of a model sync, as plain functions: given what the source holds and
//! what is loaded, which versions to load, keep, leave failed, and retire. No engines, no
//! I/O, no clock: the owner task carries them out.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::settings::ModelSettings;
use super::store::Fingerprint;

/// What a version was loaded (or failed to load) from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Origin {
    pub fingerprint: Fingerprint,
    pub settings: Arc<ModelSettings>,
}

impl Origin {
    fn same_as(&self, fingerprint: Fingerprint, settings: &ModelSettings) -> bool {
        self.fingerprint == fingerprint && *self.settings == *settings
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SyncPlan {
    /// New versions, and loaded ones whose weights or settings changed.
    pub load: Vec<u64>,
    /// Loaded and unchanged.
    pub keep: Vec<u64>,
    /// Failed before and unchanged since: not retried until their files change.
    pub still_failed: Vec<u64>,
    /// Loaded but no longer wanted by the version policy.
    pub retire: Vec<u64>,
}

impl SyncPlan {
    /// Retiring a version is only safe when the model keeps something to serve: a kept
    /// version or one that just loaded. Otherwise the old versions stay, so a broken new
    /// version never takes a working model down.
    pub fn may_retire(&self, loaded_now: &[u64]) -> bool {
        !self.keep.is_empty() || !loaded_now.is_empty()
    }
}

/// Plans one model's sync. `retry_failed` retries failed versions even when unchanged
/// (an explicit load request does; polling does not).
pub(crate) fn plan_sync(
    available: &[(u64, Fingerprint)],
    settings: &ModelSettings,
    loaded: &BTreeMap<u64, Origin>,
    failed: &BTreeMap<u64, Origin>,
    retry_failed: bool,
) -> SyncPlan {
    let versions: Vec<u64> = available.iter().map(|(v, _)| *v).collect();
    let wanted = settings.version_policy.select(&versions);
    let mut plan = SyncPlan::default();
    for &v in &wanted {
        let Some(&(_, fp)) = available.iter().find(|(av, _)| *av == v) else {
            continue;
        };
        if loaded.get(&v).is_some_and(|o| o.same_as(fp, settings)) {
            plan.keep.push(v);
        } else if !retry_failed && failed.get(&v).is_some_and(|o| o.same_as(fp, settings)) {
            plan.still_failed.push(v);
        } else {
            plan.load.push(v);
        }
    }
    plan.retire = loaded.keys().copied().filter(|v| !wanted.contains(v)).collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::VersionPolicy;

    fn fp(len: u64) -> Fingerprint {
        Fingerprint::of(&len.to_le_bytes())
    }

    fn origin(len: u64, s: &Arc<ModelSettings>) -> Origin {
        Origin {
            fingerprint: fp(len),
            settings: s.clone(),
        }
    }

    #[test]
    fn a_new_version_is_loaded_and_the_old_one_retired() {
        let s = Arc::new(ModelSettings::default());
        let loaded = BTreeMap::from([(1, origin(10, &s))]);
        let plan = plan_sync(&[(1, fp(10)), (2, fp(20))], &s, &loaded, &BTreeMap::new(), false);
        assert_eq!(plan.load, [2]);
        assert_eq!(plan.retire, [1]);
        assert!(plan.keep.is_empty());
        assert!(plan.may_retire(&[2]), "v2 loaded: v1 can go");
        assert!(!plan.may_retire(&[]), "v2 failed: v1 keeps serving");
    }

    #[test]
    fn unchanged_versions_are_kept_and_changed_ones_reloaded() {
        let s = Arc::new(ModelSettings {
            version_policy: VersionPolicy::All,
            ..Default::default()
        });
        let loaded = BTreeMap::from([(1, origin(10, &s)), (2, origin(20, &s))]);
        let plan = plan_sync(&[(1, fp(10)), (2, fp(21))], &s, &loaded, &BTreeMap::new(), false);
        assert_eq!(
            (plan.keep.as_slice(), plan.load.as_slice()),
            ([1].as_slice(), [2].as_slice())
        );
        assert!(plan.retire.is_empty());
        // New settings reload everything.
        let mut changed = (*s).clone();
        changed.engine.instances = 2;
        let changed = Arc::new(changed);
        let plan = plan_sync(
            &[(1, fp(10)), (2, fp(20))],
            &changed,
            &loaded,
            &BTreeMap::new(),
            false,
        );
        assert_eq!(plan.load, [2, 1]);
    }

    #[test]
    fn failed_versions_wait_for_their_files_to_change_unless_asked() {
        let s = Arc::new(ModelSettings::default());
        let failed = BTreeMap::from([(3, origin(7, &s))]);
        let plan = plan_sync(&[(3, fp(7))], &s, &BTreeMap::new(), &failed, false);
        assert_eq!(plan.still_failed, [3]);
        assert!(plan.load.is_empty());
        assert_eq!(
            plan_sync(&[(3, fp(8))], &s, &BTreeMap::new(), &failed, false).load,
            [3]
        );
        assert_eq!(
            plan_sync(&[(3, fp(7))], &s, &BTreeMap::new(), &failed, true).load,
            [3]
        );
    }

    #[test]
    fn a_vanished_version_is_retired() {
        let s = Arc::new(ModelSettings {
            version_policy: VersionPolicy::All,
            ..Default::default()
        });
        let loaded = BTreeMap::from([(1, origin(10, &s)), (2, origin(20, &s))]);
        let plan = plan_sync(&[(2, fp(20))], &s, &loaded, &BTreeMap::new(), false);
        assert_eq!(
            (plan.keep.as_slice(), plan.retire.as_slice()),
            ([2].as_slice(), [1].as_slice())
        );
        assert!(plan.may_retire(&[]));
    }
}
