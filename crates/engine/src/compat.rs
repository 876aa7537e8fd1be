//! What Postgres clients expect where DataFusion differs: `generate_series` as a set-returning
//! function, result columns named as Postgres names them, the array parameter of `= ANY($1)`
//! typed, command tags.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

/// The most expressions a statement may have (ClickHouse's `max_ast_elements`, at its
/// default). Planning costs more than the statement's size: a select list of a million items
/// (2 MB of text) took gigabytes and minutes of an engine thread, which nothing can stop once
/// it started (no cancel reaches planning).
pub(crate) const MAX_AST_ELEMENTS: usize = 50_000;

/// The widest select list, PostgreSQL's (`MaxTupleAttributeNumber`): planning a projection
/// costs the square of its width (20,000 items: 4.6 s).
pub(crate) const MAX_SELECT_ITEMS: usize = 1664;

/// The most tokens a text may have for the engine to parse it: eight per expression of
/// [`MAX_AST_ELEMENTS`] (a 50,000-value `IN` list has 100,000). Parsing is linear but not
/// small: the 8 MB `SELECT 1,1,…` of 4 million items took gigabytes to parse before it could
/// be refused.
pub(crate) const MAX_TOKENS: usize = 8 * MAX_AST_ELEMENTS;

/// Refuses a text past [`MAX_TOKENS`] before it is parsed (TOO_BIG_AST, SQLSTATE 54001): one
/// pass of sluice's lexer, which allocates nothing per token.
pub(crate) fn check_tokens(sql: &str) -> sluice_sql::Result<()> {
    use sluice_sql::lexer::{lex, TokenKind, Tokens};
    struct Count(usize);
    impl Tokens for Count {
        #[inline]
        fn token(&mut self, _: TokenKind, _: std::ops::Range<usize>) {
            self.0 += 1;
        }
    }
    // Short texts cannot hold that many (a token takes a byte at least).
    if sql.len() <= MAX_TOKENS {
        return Ok(());
    }
    let mut count = Count(0);
    lex(sql, &mut count);
    if count.0 > MAX_TOKENS {
        return Err(sluice_sql::Error::new(
            sluice_sql::ErrorCode::TooBigAst,
            format!(
                "AST is too big: the statement has {} tokens, more than the engine parses ({MAX_TOKENS}); split it, or put long lists of values in a table",
                count.0
            ),
        ));
    }
    Ok(())
}

/// Refuses, before it is planned, a statement past [`MAX_AST_ELEMENTS`] expressions or with a
/// select list wider than [`MAX_SELECT_ITEMS`] (TOO_BIG_AST, SQLSTATE 54001). Counting stops
/// at the limit, so a huge statement costs no more than a big one.
pub(crate) fn check_size(statement: &datafusion::sql::parser::Statement) -> sluice_sql::Result<()> {
    use datafusion::sql::parser::{CopyToSource, Statement};
    match statement {
        Statement::Statement(inner) => check_node(inner.as_ref()),
        Statement::CopyTo(copy) => match &copy.source {
            CopyToSource::Query(query) => check_node(query.as_ref()),
            CopyToSource::Relation(_) => Ok(()),
        },
        Statement::Explain(explain) => check_size(&explain.statement),
        _ => Ok(()),
    }
}

fn check_node<N: datafusion::sql::sqlparser::ast::Visit>(node: &N) -> sluice_sql::Result<()> {
    use datafusion::sql::sqlparser::ast::{Expr, Query, SetExpr, Visitor};
    use sluice_sql::{Error, ErrorCode};
    use std::ops::ControlFlow;
    fn widest(body: &SetExpr) -> usize {
        match body {
            SetExpr::Select(select) => select.projection.len(),
            SetExpr::SetOperation { left, right, .. } => widest(left).max(widest(right)),
            _ => 0,
        }
    }
    struct Size {
        expressions: usize,
    }
    impl Visitor for Size {
        type Break = Error;
        fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<Error> {
            self.expressions += 1;
            if self.expressions > MAX_AST_ELEMENTS {
                return ControlFlow::Break(Error::new(
                    ErrorCode::TooBigAst,
                    format!(
                        "AST is too big. Maximum: {MAX_AST_ELEMENTS} expressions; split the statement, or put long lists of values in a table"
                    ),
                ));
            }
            ControlFlow::Continue(())
        }
        fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<Error> {
            let width = widest(&query.body);
            if width > MAX_SELECT_ITEMS {
                return ControlFlow::Break(Error::new(
                    ErrorCode::TooBigAst,
                    format!("target lists can have at most {MAX_SELECT_ITEMS} entries (this one has {width})"),
                ));
            }
            ControlFlow::Continue(())
        }
    }
    match node.visit(&mut Size { expressions: 0 }) {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// `generate_series` as Postgres has it, where DataFusion differs: in a select list it is a
/// set-returning function (one row per value; DataFusion's returns one list), so it is
/// unnested there; in `FROM` its column is named after the function or the table alias
/// (DataFusion calls it `value`). Applied to every query in the statement (subqueries,
/// CTEs, `CREATE TABLE … AS`, `INSERT … SELECT`).
pub(crate) fn postgres_series(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{Query, VisitMut, VisitorMut};
    use std::ops::ControlFlow;
    struct Series;
    impl VisitorMut for Series {
        type Break = ();
        fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
            set_returning_series(query);
            ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Series);
}

/// What to do with a placeholder among a table function's arguments
/// ([`table_function_placeholders`]).
#[derive(Clone, Copy)]
pub(crate) enum TableArguments<'a> {
    /// Left as written: no values yet and none needed (a statement to run: a placeholder
    /// with no value is an error there, as it should be).
    Leave,
    /// Replaced by a one, to plan the statement for its columns and its parameters' types
    /// (Parse, Describe): never run so.
    Typed,
    /// Replaced by the values bound (`$1` by the first), to run.
    Bound(&'a [datafusion::common::ScalarValue]),
}

/// Placeholders among a table function's arguments (`FROM generate_series(1, $1)`): DataFusion
/// calls a table function with its arguments when it plans, and takes literals only, where
/// PostgreSQL binds a parameter there as anywhere else; a driver's `generate_series(1, ?)`
/// failed to plan. Each such placeholder is written in as the value bound to it (or, to
/// describe the statement, as a one). Returns those placeholders' numbers with the type
/// each is announced as: `int8` when it is an argument of its own (`generate_series`'s integer
/// form), the integer type it is cast to (`$1::int4`), unknown otherwise (`text`, read by
/// the statement's own cast: `$1::timestamp`).
///
/// A SQL `PREPARE`'s statement is planned when it is prepared, before any value is known: its
/// table functions' placeholders are written in as ones whatever `arguments` says (the plan
/// is kept for its columns and its other parameters' types; its `EXECUTE` plans the statement
/// again with the values, from [`prepared_text`]).
pub(crate) fn table_function_placeholders(
    statement: &mut datafusion::sql::parser::Statement,
    arguments: TableArguments<'_>,
) -> Vec<(usize, Option<datafusion::arrow::datatypes::DataType>)> {
    use datafusion::arrow::datatypes::DataType as Arrow;
    use datafusion::sql::sqlparser::ast::{
        DataType, Expr, FunctionArg, FunctionArgExpr, TableFactor, Value, VisitMut, VisitorMut,
    };
    use std::ops::ControlFlow;
    let datafusion::sql::parser::Statement::Statement(inner) = statement else {
        return Vec::new();
    };
    let (inner, arguments, declared) = match inner.as_mut() {
        datafusion::sql::sqlparser::ast::Statement::Prepare {
            statement,
            data_types,
            ..
        } => (
            statement.as_mut(),
            TableArguments::Typed,
            data_types.clone(),
        ),
        inner => (inner, arguments, Vec::new()),
    };
    if matches!(arguments, TableArguments::Leave) {
        return Vec::new();
    }
    fn number(e: &Expr) -> Option<usize> {
        match e {
            Expr::Value(v) => match &v.value {
                Value::Placeholder(p) => p.strip_prefix('$')?.parse().ok().filter(|&n| n > 0),
                _ => None,
            },
            _ => None,
        }
    }
    /// The Arrow type of an integer SQL type (the cast a placeholder may carry).
    fn integer(t: &DataType) -> Option<Arrow> {
        match t {
            DataType::BigInt(_) | DataType::Int8(_) | DataType::Int64 => Some(Arrow::Int64),
            DataType::Int(_) | DataType::Int4(_) | DataType::Integer(_) | DataType::Int32 => {
                Some(Arrow::Int32)
            }
            DataType::SmallInt(_) | DataType::Int2(_) => Some(Arrow::Int16),
            _ => None,
        }
    }
    /// A value of the SQL type `t` to plan with when it is not a number: a `PREPARE`'s
    /// placeholder declared `timestamp` is written in as a timestamp, so that the statement's
    /// own arithmetic on it (`$1 + interval '2 day'`) plans.
    fn sample(t: &DataType) -> Option<Expr> {
        let value = match t {
            DataType::Date | DataType::Datetime(_) | DataType::Timestamp(..) => "2000-01-01",
            DataType::Time(..) => "00:00:00",
            DataType::Interval { .. } => "1 day",
            _ => return None,
        };
        Some(Expr::Cast {
            kind: datafusion::sql::sqlparser::ast::CastKind::Cast,
            expr: Box::new(Expr::value(Value::SingleQuotedString(value.into()))),
            data_type: t.clone(),
            array: false,
            format: None,
        })
    }
    struct Arguments<'a> {
        arguments: TableArguments<'a>,
        /// The types a `PREPARE` declared (`$1` the first).
        declared: Vec<DataType>,
        found: Vec<(usize, Option<Arrow>)>,
    }
    impl Arguments<'_> {
        /// The placeholder `e` is, written in; `typed`: announced as that integer type.
        fn replace(&mut self, e: &mut Expr, typed: Option<Arrow>) {
            let Some(n) = number(e) else { return };
            let replacement = match self.arguments {
                TableArguments::Leave => return,
                // A one, not a NULL (DataFusion's integer series takes an untyped NULL only,
                // and a NULL under the statement's cast, `$1::int4`, is typed) nor a zero (a
                // step of zero is refused).
                TableArguments::Typed => self
                    .declared
                    .get(n - 1)
                    .and_then(sample)
                    .unwrap_or_else(|| Expr::value(Value::Number("1".into(), false))),
                TableArguments::Bound(values) => match values.get(n - 1) {
                    Some(value) => literal(value),
                    // No value: left for binding to say so.
                    None => return,
                },
            };
            *e = replacement;
            self.found.push((n, typed));
        }

        /// A table function's argument: a placeholder of its own, a placeholder under casts
        /// (`$1::int4`, and the `int8` cast the integer bounds are given around that), or an
        /// expression with placeholders deeper.
        fn argument(&mut self, e: &mut Expr) {
            match e {
                Expr::Cast {
                    expr, data_type, ..
                } if number(expr).is_some() => {
                    let typed = integer(data_type);
                    self.replace(expr, typed);
                }
                Expr::Cast { expr, .. } if matches!(**expr, Expr::Cast { .. }) => {
                    self.argument(expr)
                }
                e if number(e).is_some() => self.replace(e, Some(Arrow::Int64)),
                // Deeper (`$1 + 1`): written in, its type left to the client.
                e => {
                    let _ = datafusion::sql::sqlparser::ast::visit_expressions_mut(e, |inner| {
                        self.replace(inner, None);
                        ControlFlow::<()>::Continue(())
                    });
                }
            }
        }
    }
    impl VisitorMut for Arguments<'_> {
        type Break = ();
        fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
            let TableFactor::Table {
                args: Some(args), ..
            } = factor
            else {
                return ControlFlow::Continue(());
            };
            for arg in &mut args.args {
                let (FunctionArg::Unnamed(FunctionArgExpr::Expr(e))
                | FunctionArg::Named {
                    arg: FunctionArgExpr::Expr(e),
                    ..
                }) = arg
                else {
                    continue;
                };
                self.argument(e);
                // A NULL bound under casts is a typed NULL, which DataFusion's series refuses
                // (it takes an untyped one): the argument is NULL, as PostgreSQL's would be.
                if null_under_casts(e) {
                    *e = Expr::value(Value::Null);
                }
            }
            ControlFlow::Continue(())
        }
    }
    fn null_under_casts(e: &Expr) -> bool {
        match e {
            Expr::Cast { expr, .. } => match expr.as_ref() {
                Expr::Value(v) => matches!(v.value, Value::Null),
                inner => null_under_casts(inner),
            },
            _ => false,
        }
    }
    let mut visitor = Arguments {
        arguments,
        declared,
        found: Vec::new(),
    };
    let _ = inner.visit(&mut visitor);
    visitor.found
}

/// The text of a SQL `PREPARE`'s statement as the client wrote it (before any rewrite), for
/// its `EXECUTE` to plan again when a table function takes its placeholders
/// ([`table_function_placeholders`]); `None` for any other statement.
pub(crate) fn prepared_text(statement: &datafusion::sql::parser::Statement) -> Option<String> {
    match statement {
        datafusion::sql::parser::Statement::Statement(inner) => match inner.as_ref() {
            datafusion::sql::sqlparser::ast::Statement::Prepare { statement, .. } => {
                Some(statement.to_string())
            }
            _ => None,
        },
        _ => None,
    }
}

/// `value` as SQL text's literal: numbers and booleans as themselves, anything else as its
/// text (a string literal, which the cast the statement puts on it reads: a `PREPARE`'s
/// values come cast to the types it declared, a timestamp as a timestamp).
fn literal(value: &datafusion::common::ScalarValue) -> datafusion::sql::sqlparser::ast::Expr {
    use datafusion::common::ScalarValue as S;
    use datafusion::sql::sqlparser::ast::{Expr, UnaryOperator, Value};
    if value.is_null() {
        return Expr::value(Value::Null);
    }
    let number = |text: String| match text.strip_prefix('-') {
        Some(magnitude) => Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr: Box::new(Expr::value(Value::Number(magnitude.to_string(), false))),
        },
        None => Expr::value(Value::Number(text, false)),
    };
    match value {
        S::Int8(_)
        | S::Int16(_)
        | S::Int32(_)
        | S::Int64(_)
        | S::UInt8(_)
        | S::UInt16(_)
        | S::UInt32(_)
        | S::UInt64(_)
        | S::Decimal128(..) => number(value.to_string()),
        S::Float32(Some(f)) if f.is_finite() => number(value.to_string()),
        S::Float64(Some(f)) if f.is_finite() => number(value.to_string()),
        S::Boolean(Some(b)) => Expr::value(Value::Boolean(*b)),
        S::Utf8(Some(text)) | S::LargeUtf8(Some(text)) | S::Utf8View(Some(text)) => {
            Expr::value(Value::SingleQuotedString(text.clone()))
        }
        // As Arrow shows it (`2026-01-01T00:00:00`), which a cast reads back: a scalar's own
        // text is its storage for some types (a timestamp's nanoseconds). A date, time or
        // interval is cast back to its type, so that the statement need not cast it itself
        // (`$1 + interval '2 day'`).
        other => {
            let shown = other.to_array().ok().and_then(|array| {
                datafusion::arrow::util::display::array_value_to_string(&array, 0).ok()
            });
            let text = Expr::value(Value::SingleQuotedString(
                shown.unwrap_or_else(|| other.to_string()),
            ));
            match temporal_type(&other.data_type()) {
                Some(data_type) => Expr::Cast {
                    kind: datafusion::sql::sqlparser::ast::CastKind::Cast,
                    expr: Box::new(text),
                    data_type,
                    array: false,
                    format: None,
                },
                None => text,
            }
        }
    }
}

/// The SQL type of an Arrow date, time, timestamp or interval, as a cast names it.
fn temporal_type(
    t: &datafusion::arrow::datatypes::DataType,
) -> Option<datafusion::sql::sqlparser::ast::DataType> {
    use datafusion::arrow::datatypes::DataType as Arrow;
    use datafusion::sql::sqlparser::ast::{DataType, TimezoneInfo};
    Some(match t {
        Arrow::Date32 | Arrow::Date64 => DataType::Date,
        Arrow::Time32(_) | Arrow::Time64(_) => DataType::Time(None, TimezoneInfo::None),
        Arrow::Timestamp(_, None) => DataType::Timestamp(None, TimezoneInfo::None),
        Arrow::Timestamp(_, Some(_)) => DataType::Timestamp(None, TimezoneInfo::Tz),
        Arrow::Interval(_) => DataType::Interval {
            fields: None,
            precision: None,
        },
        _ => return None,
    })
}

/// Types the placeholder of `x = ANY($n)` (and `x <> ALL($n)`; DataFusion plans both with
/// `array_has($n, x)`) and of the orderings (`x < ANY($n)`, `x >= ALL($n)`, …: compared with
/// `array_min($n)` or `array_max($n)`) as an array of `x`'s type, as Postgres infers `$n` to
/// be `x`'s array type. DataFusion leaves it untyped, so a client sending the array as text
/// (node-postgres does) bound a string where a list belongs and the statement failed to plan;
/// typed, the client is told the array type and its value is decoded as one.
pub(crate) fn array_placeholders(
    plan: datafusion::logical_expr::LogicalPlan,
) -> datafusion::error::Result<datafusion::logical_expr::LogicalPlan> {
    use datafusion::arrow::datatypes::{DataType, Field};
    use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::expr::{BinaryExpr, Placeholder, ScalarFunction};
    use datafusion::logical_expr::{Expr, ExprSchemable};
    /// `$n` of `array_min($n)` or `array_max($n)`.
    fn bound(e: &Expr) -> Option<&String> {
        match e {
            Expr::ScalarFunction(ScalarFunction { func, args })
                if matches!(func.name(), "array_min" | "array_max") =>
            {
                match args.as_slice() {
                    [Expr::Placeholder(Placeholder { id, field: None })] => Some(id),
                    _ => None,
                }
            }
            _ => None,
        }
    }
    // First each such placeholder's type, then every use of it typed (`x <> ALL($1)` uses
    // `$1` in four functions; all must agree).
    let mut lists = std::collections::HashMap::new();
    plan.apply_with_subqueries(|node| {
        // `x` is a column of the node's inputs (or, for a join's condition, of its output).
        let schemas: Vec<_> = node
            .inputs()
            .iter()
            .map(|input| input.schema().clone())
            .chain(std::iter::once(node.schema().clone()))
            .collect();
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                // `array_has($n, x)` for `=`; `array_min($n) < x` and the like for orderings.
                let found = match e {
                    Expr::ScalarFunction(ScalarFunction { func, args })
                        if func.name() == "array_has" =>
                    {
                        match args.as_slice() {
                            [Expr::Placeholder(Placeholder { id, field: None }), needle] => {
                                Some((id, needle))
                            }
                            _ => None,
                        }
                    }
                    Expr::BinaryExpr(BinaryExpr { left, right, .. }) => {
                        match (bound(left), bound(right)) {
                            (Some(id), None) => Some((id, right.as_ref())),
                            (None, Some(id)) => Some((id, left.as_ref())),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                if let Some((id, needle)) = found {
                    let element = schemas.iter().find_map(|s| needle.get_type(s).ok());
                    if let Some(element) = element.filter(|t| *t != DataType::Null) {
                        let list = DataType::List(Arc::new(Field::new_list_field(element, true)));
                        lists.insert(id.clone(), Arc::new(Field::new("", list, true)));
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    if lists.is_empty() {
        return Ok(plan);
    }
    plan.transform_up_with_subqueries(|node| {
        node.map_expressions(|expr| {
            expr.transform_up(|e| match &e {
                Expr::Placeholder(Placeholder { id, field: None }) if lists.contains_key(id) => {
                    let field = lists.get(id).cloned();
                    Ok(Transformed::yes(Expr::Placeholder(
                        Placeholder::new_with_field(id.clone(), field),
                    )))
                }
                _ => Ok(Transformed::no(e)),
            })
        })
    })
    .map(|t| t.data)
}

/// The elements of a one-dimensional array in Postgres's text form (`{1,2}`,
/// `{"a b","c\"d",NULL}`), as a client sends an array parameter it leaves untyped; `None`
/// when `text` is not such an array (or has more dimensions).
pub(crate) fn postgres_array_elements(text: &str) -> Option<Vec<Option<String>>> {
    let inner = text.trim().strip_prefix('{')?.strip_suffix('}')?;
    let mut elements = Vec::new();
    if inner.trim().is_empty() {
        return Some(elements);
    }
    let mut chars = inner.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let element = if chars.next_if_eq(&'"').is_some() {
            let mut quoted = String::new();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => quoted.push(chars.next()?),
                    c => quoted.push(c),
                }
            }
            Some(quoted)
        } else {
            let mut bare = String::new();
            while let Some(c) = chars.next_if(|c| *c != ',') {
                match c {
                    '{' | '}' | '"' => return None,
                    '\\' => bare.push(chars.next()?),
                    c => bare.push(c),
                }
            }
            let bare = bare.trim_end().to_string();
            if bare.is_empty() {
                return None;
            }
            (!bare.eq_ignore_ascii_case("null")).then_some(bare)
        };
        elements.push(element);
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        match chars.next() {
            None => return Some(elements),
            Some(',') => {}
            Some(_) => return None,
        }
    }
}

/// [`postgres_series`] for one query's own select lists and `FROM` clauses (its subqueries
/// are queries of their own).
fn set_returning_series(query: &mut datafusion::sql::sqlparser::ast::Query) {
    use datafusion::sql::sqlparser::ast::{
        Expr, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, Ident,
        ObjectName, SelectItem, SetExpr, TableAlias, TableAliasColumnDef, TableFactor,
    };
    fn is_series(name: &ObjectName) -> bool {
        name.0.last().and_then(|p| p.as_ident()).is_some_and(|i| {
            i.quote_style.is_none() && i.value.eq_ignore_ascii_case("generate_series")
        })
    }
    fn unnest(expr: &mut Expr) -> bool {
        let Expr::Function(f) = expr else {
            return false;
        };
        if !is_series(&f.name) {
            return false;
        }
        let mut wrapper = f.clone();
        wrapper.name = ObjectName::from(vec![Ident::new("unnest")]);
        wrapper.args = FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(expr.clone()))],
            clauses: vec![],
        });
        *expr = Expr::Function(wrapper);
        true
    }
    fn relation(factor: &mut TableFactor) {
        match factor {
            TableFactor::Table {
                name,
                alias,
                args: Some(args),
                with_ordinality: false,
                ..
            } if is_series(name) => {
                integer_bounds(&mut args.args);
                let alias = alias.get_or_insert_with(|| TableAlias {
                    explicit: true,
                    name: Ident::new("generate_series"),
                    columns: vec![],
                    at: None,
                });
                if alias.columns.is_empty() {
                    alias.columns = vec![TableAliasColumnDef::from_name(alias.name.value.clone())];
                }
            }
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => {
                relation(&mut table_with_joins.relation);
                for join in &mut table_with_joins.joins {
                    relation(&mut join.relation);
                }
            }
            _ => {}
        }
    }
    // `generate_series(1, array_upper(a, 1))` (pgjdbc's type lookup): DataFusion's takes
    // int8 literals only, and the bound, folded, is an int4; Postgres's integer series takes
    // any integers. When the start is an integer literal, the other bounds become int8.
    fn integer_bounds(args: &mut [FunctionArg]) {
        use datafusion::sql::sqlparser::ast::{CastKind, DataType, Value};
        fn expr(arg: &mut FunctionArg) -> Option<&mut Expr> {
            match arg {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                _ => None,
            }
        }
        fn integer(e: &Expr) -> bool {
            match e {
                Expr::Value(v) => {
                    matches!(&v.value, Value::Number(n, _) if !n.contains(['.', 'e', 'E']))
                }
                _ => false,
            }
        }
        let Some((first, rest)) = args.split_first_mut() else {
            return;
        };
        if !expr(first).is_some_and(|e| integer(e)) {
            return;
        }
        for bound in rest.iter_mut().filter_map(expr) {
            if !integer(bound) {
                *bound = Expr::Cast {
                    kind: CastKind::Cast,
                    expr: Box::new(bound.clone()),
                    data_type: DataType::BigInt(None),
                    array: false,
                    format: None,
                };
            }
        }
    }
    fn body(set: &mut SetExpr) {
        match set {
            SetExpr::Select(select) => {
                for item in &mut select.projection {
                    let unnamed = match item {
                        SelectItem::UnnamedExpr(expr) => unnest(expr).then(|| expr.clone()),
                        SelectItem::ExprWithAlias { expr, .. } => {
                            unnest(expr);
                            None
                        }
                        _ => None,
                    };
                    // Postgres names the column after the function.
                    if let Some(expr) = unnamed {
                        *item = SelectItem::ExprWithAlias {
                            expr,
                            alias: Ident::new("generate_series"),
                        };
                    }
                }
                for from in &mut select.from {
                    relation(&mut from.relation);
                    for join in &mut from.joins {
                        relation(&mut join.relation);
                    }
                }
            }
            SetExpr::SetOperation { left, right, .. } => {
                body(left);
                body(right);
            }
            _ => {}
        }
    }
    body(&mut query.body);
}

/// What Postgres would call each result column of a plain `SELECT` where DataFusion's name is
/// an expression's text: a function's name (`count`), a cast column's name, else `?column?`.
/// `None` for an item DataFusion already names as Postgres does (aliases, columns), and for
/// statements whose columns do not map one to one (wildcards, set operations).
pub(crate) fn column_names(
    statement: &datafusion::sql::parser::Statement,
) -> Option<Vec<Option<String>>> {
    let datafusion::sql::parser::Statement::Statement(statement) = statement else {
        return None;
    };
    select_names(statement)
}

/// [`column_names`] of a parsed statement; a `PREPARE`'s are its statement's (kept for its
/// `EXECUTE`s).
fn select_names(
    statement: &datafusion::sql::sqlparser::ast::Statement,
) -> Option<Vec<Option<String>>> {
    use datafusion::sql::sqlparser::ast::{SelectItem, SetExpr, Statement};
    let name = postgres_name;
    let query = match statement {
        Statement::Query(query) => query,
        Statement::Prepare { statement, .. } => return select_names(statement),
        _ => return None,
    };
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    select
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) => Some(name(e)),
            SelectItem::ExprWithAlias { .. } => Some(None),
            _ => None,
        })
        .collect()
}

/// The name Postgres gives an unaliased select item; `None` for a column (DataFusion names it
/// the same).
pub(crate) fn postgres_name(expr: &datafusion::sql::sqlparser::ast::Expr) -> Option<String> {
    use datafusion::sql::sqlparser::ast::Expr;
    match expr {
        Expr::Identifier(_) | Expr::CompoundIdentifier(_) => None,
        Expr::Function(f) => f.name.0.last().map(|p| p.to_string().to_lowercase()),
        Expr::Cast { expr, .. } | Expr::Nested(expr) => match expr.as_ref() {
            Expr::Identifier(i) => Some(i.value.clone()),
            Expr::CompoundIdentifier(parts) => parts.last().map(|i| i.value.clone()),
            inner => postgres_name(inner),
        },
        Expr::Case { .. } => Some("case".to_string()),
        _ => Some("?column?".to_string()),
    }
}

/// The result schema with the Postgres names of [`column_names`] where they apply.
pub(crate) fn postgres_names(
    schema: &datafusion::arrow::datatypes::Schema,
    names: Option<Vec<Option<String>>>,
) -> SchemaRef {
    match names {
        Some(names) if names.len() == schema.fields().len() => Arc::new(
            datafusion::arrow::datatypes::Schema::new(
                schema
                    .fields()
                    .iter()
                    .zip(names)
                    .map(|(f, n)| match n {
                        Some(n) => Arc::new(f.as_ref().clone().with_name(n)),
                        None => f.clone(),
                    })
                    .collect::<Vec<_>>(),
            )
            .with_metadata(schema.metadata().clone()),
        ),
        _ => Arc::new(schema.clone()),
    }
}

/// Rows counted by a DML statement's result (DataFusion returns one `count` column).
pub(crate) fn count(batches: &[RecordBatch]) -> usize {
    batches
        .iter()
        .filter_map(|b| b.columns().first())
        .filter_map(|c| {
            c.as_any()
                .downcast_ref::<datafusion::arrow::array::UInt64Array>()
                .map(|a| a.iter().flatten().sum::<u64>() as usize)
        })
        .sum()
}

/// `CREATE TABLE`, `DROP VIEW`, … : the first two words (three for `CREATE EXTERNAL TABLE`).
pub(crate) fn command_tag(sql: &str) -> String {
    let words: Vec<String> = sql
        .split_whitespace()
        .take(4)
        .map(|w| w.to_ascii_uppercase())
        .collect();
    match words.as_slice() {
        [a, b, _, d, ..] if b == "OR" => format!("{a} {d}"),
        [a, b, ..] if b == "EXTERNAL" || b == "UNBOUNDED" => format!("{a} TABLE"),
        [a, b, ..] => format!("{a} {b}"),
        _ => words.join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::postgres_array_elements as elements;

    fn some(items: &[Option<&str>]) -> Option<Vec<Option<String>>> {
        Some(items.iter().map(|i| i.map(str::to_string)).collect())
    }

    #[test]
    fn array_parameters_read_as_postgres_writes_them() {
        assert_eq!(
            elements("{1,2,3}"),
            some(&[Some("1"), Some("2"), Some("3")])
        );
        assert_eq!(elements("{}"), some(&[]));
        assert_eq!(elements(" { } "), some(&[]));
        assert_eq!(elements(r#"{"1","2"}"#), some(&[Some("1"), Some("2")]));
        assert_eq!(
            elements(r#"{ a b , "c,d", "e\"f", NULL, "NULL", null, g\,h}"#),
            some(&[
                Some("a b"),
                Some("c,d"),
                Some("e\"f"),
                None,
                Some("NULL"),
                None,
                Some("g,h")
            ])
        );
        assert_eq!(elements(r#"{"",x}"#), some(&[Some(""), Some("x")]));
        assert_eq!(elements(r#"{a\"b}"#), some(&[Some("a\"b")]));
        for bad in [
            "1,2",
            "{1,2",
            "{{1,2},{3,4}}",
            r#"{"a}"#,
            r#"{"a"b}"#,
            "{1,,2}",
            "{1,}",
        ] {
            assert_eq!(elements(bad), None, "{bad}");
        }
    }
}
