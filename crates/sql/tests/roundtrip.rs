//! Property tests: whatever `Display` prints parses back to the same statement (normalized), and
//! the parser returns (never panics) on any input.

use proptest::prelude::*;
use sluice_sql::{
    parse_script, parse_statement, Attribute, Comparison, CreateClassifier, CreateOptions,
    CreateResource, CreateWorkload, DiskRef, DropEntity, EntityKind, Literal, Predicate,
    ResourceOperation, SettingChange, Statement,
};

/// Names of every flavour: plain, digit-led, keywords, and arbitrary text needing quotes.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z_][A-Za-z0-9_]{0,10}",
        "[0-9][A-Za-z0-9_]{0,6}",
        prop::sample::select(vec![
            "all", "ALL", "select", "Null", "table", "distinct", "IF", "ON", "IN", "SETTINGS",
            "FOR", "OR", "ANY", "DISK", "CLUSTER", "inf", "nan", "true",
        ])
        .prop_map(String::from),
        "[^\u{0}]{1,12}",
        "[ `\"'\\\\.a-z]{1,6}",
    ]
}

fn literal() -> impl Strategy<Value = Literal> {
    prop_oneof![
        any::<u64>().prop_map(Literal::UInt),
        (i64::MIN..0i64).prop_map(Literal::Int),
        any::<f64>().prop_map(Literal::Float),
        prop::sample::select(vec![
            0.0,
            -0.0,
            1e19,
            1e21,
            1e-7,
            2.5,
            f64::INFINITY,
            f64::NEG_INFINITY
        ])
        .prop_map(Literal::Float),
        "(?s).{0,12}".prop_map(Literal::String),
        Just(Literal::Null),
        any::<bool>().prop_map(Literal::Bool),
    ]
}

fn setting() -> impl Strategy<Value = SettingChange> {
    // Setting names are printed raw, so they are bare words (as ClickHouse prints them).
    (
        "[a-z_][a-z0-9_]{0,15}",
        literal(),
        proptest::option::of(name()),
    )
        .prop_map(|(name, value, resource)| SettingChange {
            name,
            value,
            resource,
        })
}

fn options() -> impl Strategy<Value = CreateOptions> {
    (any::<bool>(), any::<bool>(), proptest::option::of(name())).prop_map(
        |(or_replace, if_not_exists, on_cluster)| CreateOptions {
            or_replace,
            if_not_exists: if_not_exists && !or_replace,
            on_cluster,
        },
    )
}

fn disk() -> impl Strategy<Value = DiskRef> {
    prop_oneof![Just(DiskRef::Any), name().prop_map(DiskRef::Named)]
}

fn operations() -> impl Strategy<Value = Vec<ResourceOperation>> {
    let io = prop_oneof![
        disk().prop_map(ResourceOperation::Read),
        disk().prop_map(ResourceOperation::Write)
    ];
    let cpu = prop_oneof![
        Just(ResourceOperation::MasterThread),
        Just(ResourceOperation::WorkerThread)
    ];
    prop_oneof![
        prop::collection::vec(io, 1..4),
        prop::collection::vec(cpu, 1..3),
        prop::collection::vec(Just(ResourceOperation::Query), 1..2),
        prop::collection::vec(Just(ResourceOperation::MemoryReservation), 1..2),
    ]
}

fn attribute() -> impl Strategy<Value = Attribute> {
    prop_oneof![
        Just(Attribute::User),
        Just(Attribute::Database),
        Just(Attribute::ApplicationName),
        Just(Attribute::ClientAddr),
        Just(Attribute::StatementKind),
        Just(Attribute::Query),
        "(?s).{0,8}".prop_map(Attribute::Tag),
    ]
}

fn predicate() -> impl Strategy<Value = Predicate> {
    let comparison = prop::sample::select(vec![
        Comparison::Eq,
        Comparison::NotEq,
        Comparison::Like,
        Comparison::ILike,
        Comparison::Regex,
    ]);
    let leaf = prop_oneof![
        (attribute(), comparison, "(?s).{0,10}").prop_map(|(attribute, op, value)| {
            Predicate::Compare {
                attribute,
                op,
                value,
            }
        }),
        (
            attribute(),
            prop::collection::vec("(?s).{0,6}", 1..4),
            any::<bool>()
        )
            .prop_map(|(attribute, values, negated)| Predicate::In {
                attribute,
                values,
                negated
            }),
        (attribute(), any::<bool>())
            .prop_map(|(attribute, negated)| Predicate::IsNull { attribute, negated }),
    ];
    leaf.prop_recursive(6, 40, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone())
                .prop_map(|(a, b)| Predicate::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone())
                .prop_map(|(a, b)| Predicate::Or(Box::new(a), Box::new(b))),
            inner.prop_map(|a| Predicate::Not(Box::new(a))),
        ]
    })
}

fn statement() -> impl Strategy<Value = Statement> {
    prop_oneof![
        (
            options(),
            name(),
            name(),
            predicate(),
            any::<i64>(),
            any::<bool>()
        )
            .prop_map(|(options, name, workload, predicate, rank, dry_run)| {
                Statement::CreateClassifier(CreateClassifier {
                    options,
                    name,
                    workload,
                    predicate,
                    rank,
                    dry_run,
                })
            }),
        (
            options(),
            name(),
            proptest::option::of(name()),
            prop::collection::vec(setting(), 0..5)
        )
            .prop_map(|(options, name, parent, settings)| {
                Statement::CreateWorkload(CreateWorkload {
                    options,
                    name,
                    parent,
                    settings,
                })
            }),
        (options(), name(), operations()).prop_map(|(options, name, operations)| {
            Statement::CreateResource(CreateResource {
                options,
                name,
                operations,
            })
        }),
        (
            prop::sample::select(vec![
                EntityKind::Workload,
                EntityKind::Resource,
                EntityKind::Classifier
            ]),
            any::<bool>(),
            name(),
            proptest::option::of(name())
        )
            .prop_map(|(kind, if_exists, name, on_cluster)| {
                Statement::Drop(DropEntity {
                    kind,
                    if_exists,
                    name,
                    on_cluster,
                })
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn printed_statements_parse_back(stmt in statement()) {
        let printed = stmt.to_string();
        let reparsed = parse_statement(&printed);
        prop_assert_eq!(reparsed, Ok(stmt.normalized()), "printed: {}", printed);
    }

    #[test]
    fn parser_never_panics_on_text(text in "(?s).{0,200}") {
        let _ = parse_script(&text);
    }

    #[test]
    fn parser_never_panics_on_token_soup(words in prop::collection::vec(prop::sample::select(vec![
        "CREATE", "OR", "REPLACE", "WORKLOAD", "RESOURCE", "IF", "NOT", "EXISTS", "DROP", "IN",
        "ON", "CLUSTER", "SETTINGS", "FOR", "=", ",", "(", ")", ";", "-", "+", "READ", "WRITE",
        "DISK", "ANY", "MASTER", "THREAD", "QUERY", "MEMORY", "RESERVATION", "x", "`y`", "'s",
        "CLASSIFIER", "WHEN", "RANK", "DRY", "RUN", "AND", "LIKE", "ILIKE", "~", "<>", "IS",
        "NULL", "user", "tag", "client_addr", "statement_kind",
        "'s'", "1", "1.5", "1e", "0x", "0x1F", "1_000", "--", "/*", "*/", "\"", "`", "\\",
    ]), 0..40)) {
        let _ = parse_script(&words.join(" "));
    }
}

/// Texts made of the pieces that decide an integer shape: digits alone and joined to words,
/// fractions, exponents, non-ASCII letters, spaces and operators.
fn shaped_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "SELECT ", "a", "x1", "1", "2", "12", "007", ".", " ", "=", ",", "e", "ü", "_", "(",
            ")", ";", "-", "/",
        ]),
        0..12,
    )
    .prop_map(|pieces| pieces.concat())
}

/// Whether `same_integer_shape` says of `a` and `b` what their keys say (for `a` with a shape).
fn shape_told_as_keys_tell(a: &str, b: &str) -> Result<(), TestCaseError> {
    let key = |text: &str| {
        let mut key = Vec::new();
        sluice_sql::integer_shape(text, &mut key).then_some(key)
    };
    if let Some(ka) = key(a) {
        prop_assert_eq!(
            sluice_sql::same_integer_shape(a.as_bytes(), b.as_bytes()),
            key(b).as_ref() == Some(&ka),
            "{:?} / {:?}",
            a,
            b
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// Telling that two texts have one integer shape without building keys agrees with the
    /// keys (the forwarder's memo of the last shape relies on it).
    #[test]
    fn same_integer_shape_agrees_with_the_keys(a in shaped_text(), b in shaped_text()) {
        shape_told_as_keys_tell(&a, &b)?;
    }

    /// The same, for texts made from one another by changing digits (the common case).
    #[test]
    fn same_integer_shape_agrees_when_only_digits_change(
        a in shaped_text(),
        digits in prop::collection::vec(0u8..10, 12),
    ) {
        let mut next = digits.iter().cycle();
        let b: String = a
            .chars()
            .map(|c| {
                if c.is_ascii_digit() {
                    char::from(b'0' + next.next().copied().unwrap_or(0))
                } else {
                    c
                }
            })
            .collect();
        shape_told_as_keys_tell(&a, &b)?;
    }
}
