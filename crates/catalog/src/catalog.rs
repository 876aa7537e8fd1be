//! The catalog: an immutable, versioned snapshot of workloads and resources, and the rules a
//! change must pass (ClickHouse's `WorkloadEntityStorageBase::storeEntity` / `removeEntity`,
//! reference §2), in ClickHouse's order so the first error reported is the one ClickHouse reports.

use std::sync::Arc;

use sluice_sql::{
    CreateClassifier, CreateResource, CreateWorkload, DiskRef, DropEntity, EntityKind, Error,
    ErrorCode, ResourceOperation, Result, Statement,
};

use crate::classifiers::{Rule, Rules};

use crate::settings::WorkloadSettings;

/// SQLSTATEs more precise than BAD_ARGUMENTS' 22023, for what a Postgres client tells apart:
/// an entity that exists already, and one that others still reference.
const DUPLICATE_OBJECT: &str = "42710";
const DEPENDENT_OBJECTS_STILL_EXIST: &str = "2BP01";

/// How deep the workload tree may grow. ClickHouse sets no bound; sluice does, so that walking,
/// compiling and dropping a tree (which recurse once per level) can never exhaust a stack.
pub const MAX_WORKLOAD_DEPTH: usize = 256;

/// Where an entity was defined. Config entities form a read-only layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Sql,
    Config,
}

/// A workload, a resource or a classifier, as stored: its normalized definition.
#[derive(Debug, Clone, PartialEq)]
pub enum Entity {
    Workload(CreateWorkload),
    Resource(CreateResource),
    Classifier(CreateClassifier),
}

impl Entity {
    pub fn name(&self) -> &str {
        match self {
            Entity::Workload(w) => &w.name,
            Entity::Resource(r) => &r.name,
            Entity::Classifier(c) => &c.name,
        }
    }

    pub fn kind(&self) -> EntityKind {
        match self {
            Entity::Workload(_) => EntityKind::Workload,
            Entity::Resource(_) => EntityKind::Resource,
            Entity::Classifier(_) => EntityKind::Classifier,
        }
    }

    /// The normalized `CREATE …` text ClickHouse shows as `create_query`.
    pub fn create_query(&self) -> String {
        match self {
            Entity::Workload(w) => w.to_string(),
            Entity::Resource(r) => r.to_string(),
            Entity::Classifier(c) => c.to_string(),
        }
    }

    /// Names this entity depends on: the parent, then each distinct `FOR` resource in order.
    fn references(&self) -> Vec<&str> {
        let Entity::Workload(w) = self else {
            return Vec::new();
        };
        let mut refs: Vec<&str> = w.parent.as_deref().into_iter().collect();
        for s in &w.settings {
            if let Some(r) = s.resource.as_deref() {
                if !refs[usize::from(w.parent.is_some())..].contains(&r) {
                    refs.push(r);
                }
            }
        }
        refs
    }
}

/// The disks a resource reads (`read == true`) or writes, as `system.resources` lists them:
/// in the order written, `ANY DISK` as `'ANY'`.
pub fn resource_disks(r: &CreateResource, read: bool) -> Vec<&str> {
    r.operations
        .iter()
        .filter_map(|op| match (op, read) {
            (ResourceOperation::Read(d), true) | (ResourceOperation::Write(d), false) => {
                Some(match d {
                    DiskRef::Named(n) => n.as_str(),
                    DiskRef::Any => "ANY",
                })
            }
            _ => None,
        })
        .collect()
}

/// One entity in the catalog, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub entity: Entity,
    pub origin: Origin,
}

/// What a successful statement changed, for storage to persist.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The entity was created or replaced.
    Upsert(Entity),
    /// The entity was dropped.
    Remove { kind: EntityKind, name: String },
}

/// An immutable snapshot. A change builds a new one ([`Catalog::apply`]); readers holding an
/// `Arc<Catalog>` keep a consistent view.
///
/// Invariants (checked by `apply`, relied on by the compiler in `sluice-sched`):
/// - names are unique across workloads and resources;
/// - at most one workload has no parent (the root), and every parent exists and is a workload;
/// - parent links have no cycles, so every workload reaches the root;
/// - every `FOR` names an existing resource; every workload's settings resolve for every resource;
/// - at most one resource covers each of `MASTER THREAD`, `WORKER THREAD`, `QUERY`,
///   `MEMORY RESERVATION`;
/// - lane settings hold [`lanes::check`](crate::lanes)'s rules: every `demote_to` names an
///   existing leaf, deadlines come with targets, demotions never loop;
/// - classifiers have a namespace of their own; each one's workload exists and is a leaf (so a
///   classifier's target cannot gain children or be dropped), and its predicate compiled.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    version: u64,
    /// Persistent maps: a snapshot shares all it did not change with the one it came from, so
    /// deriving a snapshot costs O(log n), not a copy.
    entities: imbl::OrdMap<String, Arc<Stored>>,
    /// Each workload's children by name (derived from `entities`, kept for speed).
    children: imbl::OrdMap<String, imbl::OrdSet<String>>,
    /// The name of the workload without a parent (derived from `entities`, kept for speed).
    root: Option<String>,
    /// The workloads that write lane settings (derived, kept so that a catalog without any
    /// skips the lane rules: loading n plain workloads stays linear).
    with_lanes: imbl::OrdSet<String>,
    /// Classifiers by name (their own namespace: a classifier may share its workload's name).
    classifiers: imbl::OrdMap<String, Arc<Stored>>,
    /// The classifiers compiled, in the order they are tried (derived from `classifiers`).
    rules: Rules,
}

impl Catalog {
    pub fn new() -> Self {
        Catalog::default()
    }

    /// Increases by one with every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn get(&self, name: &str) -> Option<&Stored> {
        self.entities.get(name).map(|s| s.as_ref())
    }

    /// The shared definition of an entity. Snapshots derived from one another share the `Arc`
    /// of every entity a change did not touch, so `Arc::ptr_eq` tells "unchanged" in O(1).
    pub fn stored(&self, name: &str) -> Option<&Arc<Stored>> {
        self.entities.get(name)
    }

    /// A classifier by name.
    pub fn classifier(&self, name: &str) -> Option<&Stored> {
        self.classifiers.get(name).map(|s| s.as_ref())
    }

    /// The entity of `kind` named `name` (classifiers have a namespace of their own).
    pub fn entity(&self, kind: EntityKind, name: &str) -> Option<&Stored> {
        match kind {
            EntityKind::Classifier => self.classifier(name),
            _ => self.get(name).filter(|s| s.entity.kind() == kind),
        }
    }

    /// All classifiers, ordered by name.
    pub fn classifiers(&self) -> impl Iterator<Item = &Stored> {
        self.classifiers.values().map(|s| s.as_ref())
    }

    /// The classifiers compiled, in the order they are tried.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The classifiers that route to `workload` (live or dry run).
    pub fn classifiers_of(&self, workload: &str) -> Vec<&str> {
        self.classifiers()
            .filter_map(|s| match &s.entity {
                Entity::Classifier(c) if c.workload == workload => Some(c.name.as_str()),
                _ => None,
            })
            .collect()
    }

    /// All workloads and resources, ordered by name (byte-wise); classifiers are
    /// [`Catalog::classifiers`].
    pub fn entities(&self) -> impl Iterator<Item = &Stored> {
        self.entities.values().map(|s| s.as_ref())
    }

    pub fn workloads(&self) -> impl Iterator<Item = &CreateWorkload> {
        self.entities().filter_map(|s| match &s.entity {
            Entity::Workload(w) => Some(w),
            _ => None,
        })
    }

    pub fn resources(&self) -> impl Iterator<Item = &CreateResource> {
        self.entities().filter_map(|s| match &s.entity {
            Entity::Resource(r) => Some(r),
            _ => None,
        })
    }

    pub fn workload(&self, name: &str) -> Option<&CreateWorkload> {
        match self.get(name).map(|s| &s.entity) {
            Some(Entity::Workload(w)) => Some(w),
            _ => None,
        }
    }

    /// The workload without a parent, if any.
    pub fn root(&self) -> Option<&CreateWorkload> {
        self.root.as_deref().and_then(|r| self.workload(r))
    }

    /// The children of a workload, ordered by name.
    pub fn children_of(&self, name: &str) -> impl Iterator<Item = &CreateWorkload> {
        self.children
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|child| self.workload(child))
    }

    /// The ancestors of a workload, parent first, up to the root.
    pub fn ancestors(&self, name: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut at = self.workload(name).and_then(|w| w.parent.as_deref());
        while let Some(p) = at {
            if out.len() > self.entities.len() {
                break; // unreachable for a valid snapshot (no cycles); bounded regardless
            }
            out.push(p);
            at = self.workload(p).and_then(|w| w.parent.as_deref());
        }
        out
    }

    /// Keeps the children index in step with a workload's parent changing from `old` to `new`.
    fn relink(&mut self, name: &str, old: Option<&str>, new: Option<&str>) {
        if old == new {
            return;
        }
        if let Some(old) = old {
            if let Some(set) = self.children.get_mut(old) {
                set.remove(name);
                if set.is_empty() {
                    self.children.remove(old);
                }
            }
        }
        if let Some(new) = new {
            self.children
                .entry(new.to_string())
                .or_default()
                .insert(name.to_string());
        }
    }

    /// Applies one statement from SQL. Returns the new snapshot and what changed (`None` when
    /// `IF [NOT] EXISTS` made it a no-op); `self` is untouched either way.
    pub fn apply(&self, statement: &Statement) -> Result<(Catalog, Option<Change>)> {
        let mut next = self.clone();
        let change = next.apply_mut(statement)?;
        Ok((next, change))
    }

    /// Applies one statement in place: for building a catalog from many statements (loading a
    /// data dir, `sluice check`) without copying it per statement. Every check runs before
    /// anything changes, so on error `self` is untouched.
    pub fn apply_mut(&mut self, statement: &Statement) -> Result<Option<Change>> {
        self.apply_from(statement, Origin::Sql)
    }

    /// Applies a statement as part of the read-only configuration layer.
    pub fn apply_config(&mut self, statement: &Statement) -> Result<Option<Change>> {
        self.apply_from(statement, Origin::Config)
    }

    /// Applies one statement of a stored catalog being loaded, without the lane rules: stored
    /// entities come back in whatever order their files are read, and a lane setting may name
    /// a workload not loaded yet (`demote_to` on the root names a leaf below it). The loader
    /// calls [`Catalog::check_lanes`] once everything is in.
    pub fn apply_loading(&mut self, statement: &Statement) -> Result<Option<Change>> {
        self.apply_entity(statement, Origin::Sql)
    }

    /// The lane rules over the whole catalog (see [`crate::lanes`]).
    pub fn check_lanes(&self) -> Result<()> {
        if self.with_lanes.is_empty() {
            return Ok(());
        }
        crate::lanes::check(self)
    }

    /// The lane settings in force for `workload`'s queries (its own, else its ancestors').
    pub fn lanes(&self, workload: &str) -> crate::lanes::Lanes {
        if self.with_lanes.is_empty() {
            return crate::lanes::Lanes::default(); // asked once per statement: keep it cheap
        }
        crate::lanes::resolve(self, workload)
    }

    fn apply_from(&mut self, statement: &Statement, origin: Origin) -> Result<Option<Change>> {
        // The lane rules span workloads (a target must stay a leaf, demotions must not loop):
        // checked on the changed candidate, which replaces `self` only once it passes.
        let mut next = self.clone();
        let change = next.apply_entity(statement, origin)?;
        if change.is_some() && !next.with_lanes.is_empty() {
            crate::lanes::check(&next)?;
        }
        *self = next;
        Ok(change)
    }

    fn apply_entity(&mut self, statement: &Statement, origin: Origin) -> Result<Option<Change>> {
        if statement.on_cluster().is_some() {
            // sluice has no replicated DDL queue; ClickHouse without one says the same.
            return Err(Error::new(
                ErrorCode::QueryIsProhibited,
                "Replicated DDL queries are disabled",
            ));
        }
        let (entity, options) = match statement {
            Statement::CreateWorkload(c) => (
                Entity::Workload(CreateWorkload {
                    options: Default::default(),
                    ..c.clone()
                }),
                &c.options,
            ),
            Statement::CreateResource(c) => (
                Entity::Resource(CreateResource {
                    options: Default::default(),
                    ..c.clone()
                }),
                &c.options,
            ),
            Statement::CreateClassifier(c) => {
                return self.store_classifier(c, origin);
            }
            Statement::Drop(d) if d.kind == EntityKind::Classifier => {
                return self.remove_classifier(d)
            }
            Statement::Drop(d) => return self.remove(d),
        };
        self.store(entity, options.or_replace, options.if_not_exists, origin)
    }

    fn store(
        &mut self,
        entity: Entity,
        replace: bool,
        if_not_exists: bool,
        origin: Origin,
    ) -> Result<Option<Change>> {
        let name = entity.name();
        if name.is_empty() {
            return Err(Error::bad_arguments(
                "Workload entity name should not be empty",
            ));
        }
        // One namespace for workloads and resources.
        if let Some(old) = self.get(name) {
            if if_not_exists {
                return Ok(None);
            }
            if !replace {
                return Err(Error::bad_arguments(format!(
                    "Workload entity '{name}' already exists"
                ))
                .with_sqlstate(DUPLICATE_OBJECT));
            }
            if old.origin == Origin::Config {
                return Err(Error::bad_arguments(format!(
                    "It is not allowed to replace workload entity '{name}' that is stored in read-only configuration storage"
                )));
            }
            match (&old.entity, &entity) {
                (Entity::Workload(_), Entity::Resource(_)) => {
                    return Err(Error::bad_arguments(format!(
                        "Workload entity '{name}' already exists, but it is not a resource"
                    ))
                    .with_sqlstate(DUPLICATE_OBJECT))
                }
                (Entity::Resource(_), Entity::Workload(_)) => {
                    return Err(Error::bad_arguments(format!(
                        "Workload entity '{name}' already exists, but it is not a workload"
                    ))
                    .with_sqlstate(DUPLICATE_OBJECT))
                }
                (Entity::Workload(old), Entity::Workload(new)) => {
                    if old.parent.is_none() && new.parent.is_some() {
                        return Err(Error::bad_arguments(
                            "It is not allowed to remove root workload",
                        ));
                    }
                }
                (Entity::Resource(old), Entity::Resource(new)) => {
                    if old.unit() != new.unit() {
                        return Err(Error::bad_arguments(format!(
                            "Cost unit of resource '{name}' cannot be changed via CREATE OR REPLACE; drop and recreate the resource instead"
                        )));
                    }
                }
                // Classifiers are stored by `store_classifier`, in their own namespace.
                (Entity::Classifier(_), _) | (_, Entity::Classifier(_)) => {}
            }
        }
        match &entity {
            Entity::Workload(w) => self.check_workload(w)?,
            Entity::Resource(r) => self.check_resource(r)?,
            Entity::Classifier(_) => {}
        }
        let name = name.to_string();
        if let Entity::Workload(w) = &entity {
            if w.parent.is_none() {
                self.root = Some(name.clone());
            }
            let old_parent = self.workload(&name).and_then(|o| o.parent.clone());
            self.relink(&name, old_parent.as_deref(), w.parent.as_deref());
            if w.settings
                .iter()
                .any(|c| crate::lanes::is_lane_setting(&c.name))
            {
                self.with_lanes.insert(name.clone());
            } else {
                self.with_lanes.remove(&name);
            }
        }
        self.version += 1;
        self.entities.insert(
            name,
            Arc::new(Stored {
                entity: entity.clone(),
                origin,
            }),
        );
        Ok(Some(Change::Upsert(entity)))
    }

    fn check_workload(&self, w: &CreateWorkload) -> Result<()> {
        if let Some(parent) = w.parent.as_deref() {
            let routing = self.classifiers_of(parent);
            if !routing.is_empty()
                && self.workload(&w.name).and_then(|o| o.parent.as_deref()) != Some(parent)
            {
                return Err(Error::new(
                    ErrorCode::InvalidSchedulerNode,
                    format!(
                        "Workload '{parent}' cannot have children: classifiers route queries to it ({}), and queries run in leaf workloads only. Point the classifiers at another leaf first",
                        routing.join(", ")
                    ),
                ));
            }
        }
        if w.parent.is_none() {
            if let Some(root) = self.root() {
                if root.name != w.name {
                    return Err(Error::bad_arguments(format!(
                        "The second root is not allowed. You should probably add 'PARENT {}' clause",
                        root.name
                    )));
                }
            }
        }
        // Settings without FOR first; FOR-bound ones once their resource is known.
        WorkloadSettings::resolve(&w.settings, None)?;
        crate::lanes::OwnLanes::read(&w.settings)?;
        let entity = Entity::Workload(w.clone());
        for (i, target) in entity.references().into_iter().enumerate() {
            let is_parent = i == 0 && w.parent.is_some();
            let Some(stored) = self.get(target) else {
                return Err(Error::bad_arguments(format!(
                    "Workload entity '{}' references another workload entity '{target}' that doesn't exist",
                    w.name
                )));
            };
            match (&stored.entity, is_parent) {
                (Entity::Workload(_), true) => {
                    let parent_depth = self.check_no_cycle(&w.name, target)?;
                    self.check_depth(&w.name, parent_depth)?;
                }
                (Entity::Resource(_), false) => {
                    WorkloadSettings::resolve(&w.settings, Some(target))?;
                }
                (_, true) => {
                    return Err(Error::bad_arguments(format!(
                        "Workload parent should reference another workload, not '{target}'"
                    )))
                }
                (_, false) => {
                    return Err(Error::bad_arguments(format!(
                        "Workload settings should reference resource in FOR clause, not '{target}'"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Making `parent` the parent of `name` must not close a loop: `parent`'s ancestors must not
    /// include `name` (parent links are the only references between workloads). Returns the
    /// depth of `parent` (the root is at depth 1).
    fn check_no_cycle(&self, name: &str, parent: &str) -> Result<usize> {
        let mut at = Some(parent);
        let mut depth = 0usize;
        while let Some(current) = at {
            if current == name || depth > self.entities.len() {
                return Err(Error::bad_arguments(
                    "Workload entity cycles are not allowed",
                ));
            }
            at = self.workload(current).and_then(|w| w.parent.as_deref());
            depth += 1;
        }
        Ok(depth)
    }

    /// The tree may not grow deeper than [`MAX_WORKLOAD_DEPTH`]: placing `name` (and whatever
    /// subtree it already has) under a parent at `parent_depth`.
    fn check_depth(&self, name: &str, parent_depth: usize) -> Result<()> {
        let depth = parent_depth + self.height(name);
        if depth > MAX_WORKLOAD_DEPTH {
            return Err(Error::bad_arguments(format!(
                "Workload '{name}' would be at depth {depth} of the workload tree; at most {MAX_WORKLOAD_DEPTH} levels are allowed"
            )));
        }
        Ok(())
    }

    /// Levels in the subtree rooted at `name` (1 for a leaf or a new workload).
    fn height(&self, name: &str) -> usize {
        let mut height = 0;
        let mut level = vec![name];
        while !level.is_empty() && height <= MAX_WORKLOAD_DEPTH {
            height += 1;
            level = level
                .iter()
                .flat_map(|n| {
                    self.children
                        .get(*n)
                        .into_iter()
                        .flatten()
                        .map(String::as_str)
                })
                .collect();
        }
        height
    }

    fn check_resource(&self, r: &CreateResource) -> Result<()> {
        for op in [
            ResourceOperation::MasterThread,
            ResourceOperation::WorkerThread,
            ResourceOperation::Query,
            ResourceOperation::MemoryReservation,
        ] {
            if !r.operations.contains(&op) {
                continue;
            }
            if let Some(other) = self
                .resources()
                .find(|o| o.name != r.name && o.operations.contains(&op))
            {
                return Err(Error::bad_arguments(format!(
                    "The second resource for {op} is not allowed. Current resource name: '{}'",
                    other.name
                )));
            }
        }
        Ok(())
    }

    fn store_classifier(&mut self, c: &CreateClassifier, origin: Origin) -> Result<Option<Change>> {
        let name = c.name.as_str();
        if name.is_empty() {
            return Err(Error::bad_arguments("Classifier name should not be empty"));
        }
        if let Some(old) = self.classifier(name) {
            if c.options.if_not_exists {
                return Ok(None);
            }
            if !c.options.or_replace {
                return Err(Error::bad_arguments(format!(
                    "Classifier '{name}' already exists; use CREATE OR REPLACE CLASSIFIER to change it"
                ))
                .with_sqlstate(DUPLICATE_OBJECT));
            }
            if old.origin == Origin::Config {
                return Err(Error::bad_arguments(format!(
                    "It is not allowed to replace classifier '{name}' that is stored in read-only configuration storage"
                )));
            }
        }
        let target = &c.workload;
        match self.get(target).map(|s| &s.entity) {
            Some(Entity::Workload(_)) => {}
            Some(_) => {
                return Err(Error::bad_arguments(format!(
                    "Classifier '{name}' routes to '{target}', which is a resource, not a workload"
                )))
            }
            None => {
                return Err(Error::bad_arguments(format!(
                    "Classifier '{name}' routes to workload '{target}' that doesn't exist; create it first"
                )))
            }
        }
        if self.children_of(target).next().is_some() {
            return Err(Error::new(
                ErrorCode::InvalidSchedulerNode,
                format!("Classifier '{name}' routes to '{target}', which has children; queries run in leaf workloads only, so a classifier must name a leaf"),
            ));
        }
        let rule = Arc::new(Rule::compile(c)?);
        let entity = Entity::Classifier(CreateClassifier {
            options: Default::default(),
            ..c.clone()
        });
        self.version += 1;
        self.classifiers.insert(
            name.to_string(),
            Arc::new(Stored {
                entity: entity.clone(),
                origin,
            }),
        );
        let mut rules: Vec<Arc<Rule>> = self
            .rules
            .iter()
            .filter(|r| r.name != name)
            .cloned()
            .collect();
        rules.push(rule);
        self.rules = Rules::new(rules);
        Ok(Some(Change::Upsert(entity)))
    }

    fn remove_classifier(&mut self, d: &DropEntity) -> Result<Option<Change>> {
        let Some(stored) = self.classifier(&d.name) else {
            if d.if_exists {
                return Ok(None);
            }
            return Err(Error::new(
                ErrorCode::ResourceNotFound,
                format!("Classifier '{}' doesn't exist", d.name),
            ));
        };
        if stored.origin == Origin::Config {
            return Err(Error::bad_arguments(format!(
                "It is not allowed to remove classifier '{}' that is stored in read-only configuration storage",
                d.name
            )));
        }
        self.version += 1;
        self.classifiers.remove(&d.name);
        self.rules = Rules::new(
            self.rules
                .iter()
                .filter(|r| r.name != d.name)
                .cloned()
                .collect(),
        );
        Ok(Some(Change::Remove {
            kind: EntityKind::Classifier,
            name: d.name.clone(),
        }))
    }

    fn remove(&mut self, d: &DropEntity) -> Result<Option<Change>> {
        let exists = self.get(&d.name).filter(|s| s.entity.kind() == d.kind);
        let Some(stored) = exists else {
            if d.if_exists {
                return Ok(None);
            }
            return Err(Error::bad_arguments(format!(
                "Workload entity '{}' doesn't exist",
                d.name
            )));
        };
        if stored.origin == Origin::Config {
            return Err(Error::bad_arguments(format!(
                "It is not allowed to remove workload entity '{}' that is stored in read-only configuration storage",
                d.name
            )));
        }
        let mut referrers: Vec<&str> = self
            .entities()
            .filter(|s| s.entity.references().contains(&d.name.as_str()))
            .map(|s| s.entity.name())
            .collect();
        for demoting in crate::lanes::demoting_to(self, &d.name) {
            if !referrers.contains(&demoting) {
                referrers.push(demoting);
            }
        }
        if referrers.is_empty() {
            let routing = self.classifiers_of(&d.name);
            if !routing.is_empty() {
                return Err(Error::bad_arguments(format!(
                    "Workload entity '{}' cannot be dropped. Classifiers route to it: {}; drop them or point them at another workload first",
                    d.name,
                    routing.join(", ")
                ))
                .with_sqlstate(DEPENDENT_OBJECTS_STILL_EXIST));
            }
        }
        if !referrers.is_empty() {
            let list: String = referrers.iter().map(|r| format!(" {r}")).collect();
            return Err(Error::bad_arguments(format!(
                "Workload entity '{}' cannot be dropped. It is referenced by:{list}",
                d.name
            ))
            .with_sqlstate(DEPENDENT_OBJECTS_STILL_EXIST));
        }
        let parent = self.workload(&d.name).and_then(|w| w.parent.clone());
        self.relink(&d.name, parent.as_deref(), None);
        self.version += 1;
        self.entities.remove(&d.name);
        self.with_lanes.remove(&d.name);
        if self.root.as_deref() == Some(d.name.as_str()) {
            self.root = None;
        }
        Ok(Some(Change::Remove {
            kind: d.kind,
            name: d.name.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sql::parse_statement;

    fn run(catalog: &Catalog, sql: &str) -> Result<Catalog> {
        let stmt = parse_statement(sql)?;
        catalog.apply(&stmt).map(|(c, _)| c)
    }

    fn ok(catalog: Catalog, sql: &str) -> Catalog {
        match run(&catalog, sql) {
            Ok(c) => c,
            Err(e) => panic!("{sql}: {e}"),
        }
    }

    #[test]
    fn rules_of_clickhouse_test_03232() {
        let mut c = Catalog::new();
        for sql in [
            "create resource 03232_write (write disk 03232_fake_disk)",
            "create resource 03232_read (read disk 03232_fake_disk)",
            "create workload all settings max_io_requests = 100 for 03232_write, max_io_requests = 200 for 03232_read",
            "create workload admin in all settings priority = 0",
            "create workload production in all settings priority = 1, weight = 9",
            "create workload development in all settings priority = 1, weight = 1",
        ] {
            c = ok(c, sql);
        }
        for (sql, code) in [
            ("create workload another_root", ErrorCode::BadArguments),
            (
                "create workload self_ref in self_ref",
                ErrorCode::BadArguments,
            ),
            ("drop workload all", ErrorCode::BadArguments),
            (
                "create workload invalid in 03232_write",
                ErrorCode::BadArguments,
            ),
            (
                "create workload invalid in all settings priority = 0 for all",
                ErrorCode::BadArguments,
            ),
            (
                "create or replace workload all in production",
                ErrorCode::BadArguments,
            ),
            (
                "create workload x in all on cluster c",
                ErrorCode::SyntaxError,
            ),
            (
                "create workload x on cluster c in all",
                ErrorCode::QueryIsProhibited,
            ),
        ] {
            assert_eq!(
                run(&c, sql).map(|_| ()).map_err(|e| e.code),
                Err(code),
                "{sql}"
            );
        }
        // Re-parenting through a leaf and back, and a cycle through OR REPLACE.
        c = ok(c, "create or replace workload development in production");
        assert!(run(&c, "create or replace workload production in development").is_err());
        c = ok(c, "create or replace workload development in all");
        let e = run(&c, "drop resource 03232_write")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("Workload entity '03232_write' cannot be dropped. It is referenced by: all. (BAD_ARGUMENTS)")
        );
        assert_eq!(c.version(), 8);
    }

    #[test]
    fn classifiers_route_to_leaves_that_stay_leaves() {
        let mut c = Catalog::new();
        for sql in [
            "CREATE RESOURCE q (QUERY)",
            "CREATE WORKLOAD all",
            "CREATE WORKLOAD prod IN all",
            "CREATE WORKLOAD dev IN all",
            // A classifier may share a workload's name: its own namespace.
            "CREATE CLASSIFIER prod WORKLOAD prod WHEN user = 'app'",
            "CREATE CLASSIFIER tagged WORKLOAD dev WHEN tag('team') = 'x' RANK 2",
        ] {
            c = ok(c, sql);
        }
        let code =
            |c: &Catalog, sql: &str| run(c, sql).map(|_| ()).map_err(|e| (e.code, e.message));
        for (sql, expected, says) in [
            (
                "CREATE CLASSIFIER x WORKLOAD nowhere WHEN user = 'a'",
                ErrorCode::BadArguments,
                "doesn't exist",
            ),
            (
                "CREATE CLASSIFIER x WORKLOAD q WHEN user = 'a'",
                ErrorCode::BadArguments,
                "is a resource",
            ),
            (
                "CREATE CLASSIFIER x WORKLOAD all WHEN user = 'a'",
                ErrorCode::InvalidSchedulerNode,
                "has children",
            ),
            (
                "CREATE CLASSIFIER prod WORKLOAD dev WHEN user = 'a'",
                ErrorCode::BadArguments,
                "already exists",
            ),
            (
                "CREATE CLASSIFIER x WORKLOAD dev WHEN query ~ '('",
                ErrorCode::BadArguments,
                "invalid regular expression",
            ),
            (
                "DROP WORKLOAD dev",
                ErrorCode::BadArguments,
                "Classifiers route to it: tagged",
            ),
            (
                "CREATE WORKLOAD sub IN prod",
                ErrorCode::InvalidSchedulerNode,
                "classifiers route queries to it (prod)",
            ),
            (
                "DROP CLASSIFIER nope",
                ErrorCode::ResourceNotFound,
                "doesn't exist",
            ),
        ] {
            match code(&c, sql) {
                Err((got, message)) => {
                    assert_eq!(got, expected, "{sql}: {message}");
                    assert!(message.contains(says), "{sql}: {message}");
                }
                Ok(()) => panic!("{sql} was accepted"),
            }
        }
        assert_eq!(
            run(&c, "DROP WORKLOAD dev").err().map(|e| e.sqlstate()),
            Some("2BP01")
        );
        // Replaced, then dropped: the target is free again.
        let before = c.rules().iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        assert_eq!(before, ["tagged", "prod"]);
        c = ok(
            c,
            "CREATE OR REPLACE CLASSIFIER tagged WORKLOAD prod WHEN tag('team') = 'x'",
        );
        assert_eq!(c.classifiers_of("prod"), ["prod", "tagged"]);
        c = ok(c, "DROP WORKLOAD dev");
        c = ok(c, "DROP CLASSIFIER IF EXISTS nope");
        c = ok(c, "DROP CLASSIFIER tagged");
        assert_eq!(c.rules().iter().count(), 1);
        assert!(c.get("prod").is_some() && c.classifier("prod").is_some());
    }

    #[test]
    fn depth_is_bounded() {
        let mut c = ok(Catalog::new(), "CREATE WORKLOAD w1");
        for i in 2..=MAX_WORKLOAD_DEPTH {
            c = ok(c, &format!("CREATE WORKLOAD w{i} IN w{}", i - 1));
        }
        let too_deep = format!("CREATE WORKLOAD x IN w{MAX_WORKLOAD_DEPTH}");
        assert!(run(&c, &too_deep).is_err_and(|e| e.message.contains("at most 256 levels")));
        // Moving a subtree counts its height: w2..w256 under a new sibling of w2 is one too deep.
        c = ok(c, "CREATE WORKLOAD side IN w1");
        assert!(run(&c, "CREATE OR REPLACE WORKLOAD w2 IN side").is_err());
        assert!(run(&c, "CREATE OR REPLACE WORKLOAD w3 IN side").is_ok());
    }
}
