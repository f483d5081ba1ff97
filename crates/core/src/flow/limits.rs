//! Size limits on what templates and expressions build.
//!
//! minijinja's operators allocate before anything outside the engine sees
//! the result (`"x" * n` builds the whole string, `[x] * n` reserves the
//! whole list), and its own caps are far above what a flow needs. So every
//! template and expression is rewritten when the flow is loaded: each `*`,
//! `+` and `~` becomes a call of a guard function that measures the result
//! it would build, refuses it past [`MAX_VALUE_BYTES`] or
//! [`MAX_SEQUENCE_ITEMS`], charges it to the evaluation's
//! [`MAX_EVAL_BYTES`], and only then runs minijinja's own operator. `range`,
//! `join` and `string` are replaced by guarded versions of the built-ins
//! the same way. The rewrite works on minijinja's parse tree: an operator
//! node's source span is replaced by the call, its operands' spans (rewritten
//! in turn) become the arguments, so precedence is the parser's.

use std::cell::Cell;
use std::fmt;
use std::sync::LazyLock;

use minijinja::machinery::{ast, parse, parse_expr};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Expression, State};

/// Bytes one string built by a template or expression may hold (a `*`, `+`
/// or `~` result, a `join`, a `string`).
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;

/// Items one list built by a template or expression may hold (a `*` or `+`
/// of lists, a `range`).
pub const MAX_SEQUENCE_ITEMS: usize = 100_000;

/// Bytes one render or evaluation may build through operators and the
/// guarded built-ins, added up over the whole run (what was freed counts
/// too): bounds the memory of a template that builds many large values.
pub const MAX_EVAL_BYTES: usize = 64 * 1024 * 1024;

/// What a list item is charged: the size of a value slot.
const ITEM_BYTES: usize = std::mem::size_of::<Value>();

const MUL: &str = "__parlance_mul";
const ADD: &str = "__parlance_add";
const CONCAT: &str = "__parlance_concat";

/// The limit a template or expression went over; the source of the
/// minijinja error the guard returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SizeLimit(pub(super) String);

impl fmt::Display for SizeLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeLimit {}

/// The size limit behind `e`, if a guard refused.
pub(super) fn size_limit(e: &Error) -> Option<&SizeLimit> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(l) = c.downcast_ref::<SizeLimit>() {
            return Some(l);
        }
        cause = c.source();
    }
    None
}

fn over(what: &str, limit: String) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("{what} would go over the limit of {limit}"),
    )
    .with_source(SizeLimit(limit))
}

fn bytes_limit() -> String {
    format!("{MAX_VALUE_BYTES} bytes per value")
}

fn items_limit() -> String {
    format!("{MAX_SEQUENCE_ITEMS} items per list")
}

thread_local! {
    /// Bytes charged by the render or evaluation running on this thread.
    static SPENT: Cell<usize> = const { Cell::new(0) };
}

/// Starts the budget of a render or evaluation. Rendering is synchronous,
/// so the one running on this thread is the one being charged.
pub(super) fn start_budget() {
    SPENT.set(0);
}

fn charge(bytes: usize) -> Result<(), Error> {
    let total = SPENT.get().saturating_add(bytes);
    if total > MAX_EVAL_BYTES {
        return Err(over(
            "the values built",
            format!("{MAX_EVAL_BYTES} bytes per evaluation"),
        ));
    }
    SPENT.set(total);
    Ok(())
}

/// Counts what is written, failing past `max`.
struct Measure {
    len: usize,
    max: usize,
}

impl fmt::Write for Measure {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.len = self.len.saturating_add(s.len());
        if self.len > self.max {
            Err(fmt::Error)
        } else {
            Ok(())
        }
    }
}

/// The length of `v` as a string, or `None` past `max` (measured without
/// building it, stopping at `max`).
fn display_len(v: &Value, max: usize) -> Option<usize> {
    if let Some(s) = v.as_str() {
        return (s.len() <= max).then_some(s.len());
    }
    let mut m = Measure { len: 0, max };
    fmt::write(&mut m, format_args!("{v}")).ok()?;
    Some(m.len)
}

/// Checks a string of `len` bytes (or more, when `None`) and charges it.
fn string_of(what: &str, len: Option<usize>) -> Result<(), Error> {
    match len {
        Some(len) if len <= MAX_VALUE_BYTES => charge(len),
        _ => Err(over(what, bytes_limit())),
    }
}

/// Checks a list of `items` items (or more, when `None`) and charges it.
fn list_of(what: &str, items: Option<usize>) -> Result<(), Error> {
    match items {
        Some(n) if n <= MAX_SEQUENCE_ITEMS => charge(n.saturating_mul(ITEM_BYTES)),
        _ => Err(over(what, items_limit())),
    }
}

fn is_list(v: &Value) -> bool {
    matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable)
}

/// minijinja's own operators, run once a guard has let the operands pass.
static OPS: LazyLock<Environment<'static>> = LazyLock::new(Environment::new);

fn run(op: &str, a: Value, b: Value) -> Result<Value, Error> {
    static COMPILED: LazyLock<[Option<Expression<'static, 'static>>; 3]> =
        LazyLock::new(|| ["a * b", "a + b", "a ~ b"].map(|src| OPS.compile_expression(src).ok()));
    let i = match op {
        "a * b" => 0,
        "a + b" => 1,
        _ => 2,
    };
    let expr = COMPILED[i].as_ref().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("`{op}` does not compile"),
        )
    })?;
    expr.eval(minijinja::context! { a => a, b => b })
}

fn guard_mul(a: Value, b: Value) -> Result<Value, Error> {
    let (s, n) = match (a.as_str(), b.as_str()) {
        (Some(s), _) => (Some(s), &b),
        (None, Some(s)) => (Some(s), &a),
        _ => (None, &b),
    };
    if let Some(s) = s {
        if let Some(n) = n.as_usize() {
            string_of("repeating a string", s.len().checked_mul(n))?;
        }
    } else {
        let (list, n) = if is_list(&a) { (&a, &b) } else { (&b, &a) };
        if is_list(list)
            && let Some(n) = n.as_usize()
        {
            list_of(
                "repeating a list",
                list.len().and_then(|len| len.checked_mul(n)),
            )?;
        }
    }
    run("a * b", a, b)
}

fn guard_add(a: Value, b: Value) -> Result<Value, Error> {
    if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
        string_of("adding strings", x.len().checked_add(y.len()))?;
    } else if (is_list(&a) || a.is_tuple()) && (is_list(&b) || b.is_tuple()) {
        let len = match (a.len(), b.len()) {
            (Some(x), Some(y)) => x.checked_add(y),
            // Unsized iterables are concatenated lazily: nothing is built.
            _ => Some(0),
        };
        list_of("adding lists", len)?;
    }
    run("a + b", a, b)
}

fn guard_concat(a: Value, b: Value) -> Result<Value, Error> {
    let len = display_len(&a, MAX_VALUE_BYTES)
        .and_then(|x| Some(x + display_len(&b, MAX_VALUE_BYTES - x)?));
    string_of("concatenating strings", len)?;
    run("a ~ b", a, b)
}

fn guard_range(lower: isize, upper: Option<isize>, step: Option<isize>) -> Result<Value, Error> {
    let (start, end) = match upper {
        Some(upper) => (lower as i128, upper as i128),
        None => (0, lower as i128),
    };
    let step = step.unwrap_or(1) as i128;
    if step != 0 {
        let span = if step > 0 { end - start } else { start - end };
        let items = if span <= 0 {
            0
        } else {
            (span + step.abs() - 1) / step.abs()
        };
        list_of("range", usize::try_from(items).ok())?;
    }
    minijinja::functions::range(lower, upper, step.try_into().ok())
}

fn guard_join(
    state: &mut State<'_, '_>,
    value: &Value,
    joiner: Option<minijinja::value::StringInput<'_>>,
    attribute: Option<&str>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let sep = joiner.as_ref().map_or(0, |j| j.as_str().len());
    let mut len = Some(0usize);
    if !value.is_undefined() && !value.is_none() && value.as_str().is_none() {
        for (i, item) in value.try_iter()?.enumerate() {
            let room = MAX_VALUE_BYTES.saturating_sub(len.unwrap_or(MAX_VALUE_BYTES));
            len = len
                .and_then(|l| l.checked_add(if i > 0 { sep } else { 0 }))
                .and_then(|l| Some(l + display_len(&item, room)?))
                .filter(|&l| l <= MAX_VALUE_BYTES);
            if len.is_none() {
                break;
            }
        }
    } else if let Some(s) = value.as_str() {
        let chars = s.chars().count();
        len = chars.checked_mul(sep).and_then(|l| l.checked_add(s.len()));
    }
    string_of("joining a list", len)?;
    minijinja::filters::join(state, value, joiner, attribute, kwargs)
}

fn guard_string(state: &State<'_, '_>, value: &Value) -> Result<Value, Error> {
    if value.as_str().is_none() {
        string_of(
            "converting a value to a string",
            display_len(value, MAX_VALUE_BYTES),
        )?;
    }
    minijinja::filters::string(state, value)
}

/// Registers the guard functions and the guarded built-ins.
pub(super) fn install(env: &mut Environment<'static>) {
    env.add_function(MUL, guard_mul);
    env.add_function(ADD, guard_add);
    env.add_function(CONCAT, guard_concat);
    env.add_function("range", guard_range);
    env.add_filter("join", guard_join);
    env.add_filter("string", guard_string);
}

/// An operator node to replace: its span, its guard and its operands' spans.
struct Op {
    start: usize,
    end: usize,
    guard: &'static str,
    left: (usize, usize),
    right: (usize, usize),
}

fn span(s: minijinja::machinery::Span) -> (usize, usize) {
    (s.start_offset as usize, s.end_offset as usize)
}

/// Where `e` is in the source: its node's span joined with its operands'
/// (a filter's or test's own span starts at its name, after its operand).
fn expr_span(e: &ast::Expr<'_>) -> (usize, usize) {
    let mut inner = Vec::new();
    let (mut start, mut end) = node_span(e);
    children(e, &mut |c| inner.push(expr_span(c)));
    for (s, e) in inner {
        start = start.min(s);
        end = end.max(e);
    }
    (start, end)
}

/// Calls `f` on each direct operand of `e`.
fn children<'a>(e: &'a ast::Expr<'a>, f: &mut impl FnMut(&'a ast::Expr<'a>)) {
    use ast::Expr as E;
    let args = |args: &'a [ast::CallArg<'a>], f: &mut dyn FnMut(&'a ast::Expr<'a>)| {
        for a in args {
            match a {
                ast::CallArg::Pos(e)
                | ast::CallArg::Kwarg(_, e)
                | ast::CallArg::PosSplat(e)
                | ast::CallArg::KwargSplat(e) => f(e),
            }
        }
    };
    match e {
        E::Var(_) | E::Const(_) => {}
        E::Slice(x) => {
            f(&x.expr);
            for c in [&x.start, &x.stop, &x.step].into_iter().flatten() {
                f(c);
            }
        }
        E::UnaryOp(x) => f(&x.expr),
        E::BinOp(x) => {
            f(&x.left);
            f(&x.right);
        }
        E::Compare(x) => {
            f(&x.expr);
            for op in &x.ops {
                f(&op.expr);
            }
        }
        E::IfExpr(x) => {
            f(&x.test_expr);
            f(&x.true_expr);
            if let Some(c) = &x.false_expr {
                f(c);
            }
        }
        E::Filter(x) => {
            if let Some(c) = &x.expr {
                f(c);
            }
            args(&x.args, f);
        }
        E::Test(x) => {
            f(&x.expr);
            args(&x.args, f);
        }
        E::GetAttr(x) => f(&x.expr),
        E::GetItem(x) => {
            f(&x.expr);
            f(&x.subscript_expr);
        }
        E::Call(x) => {
            f(&x.expr);
            args(&x.args, f);
        }
        E::List(x) => x.items.iter().for_each(&mut *f),
        E::Tuple(x) => x.items.iter().for_each(&mut *f),
        E::Map(x) => x.keys.iter().chain(&x.values).for_each(f),
    }
}

fn node_span(e: &ast::Expr<'_>) -> (usize, usize) {
    use ast::Expr as E;
    span(match e {
        E::Var(x) => x.span(),
        E::Const(x) => x.span(),
        E::Slice(x) => x.span(),
        E::UnaryOp(x) => x.span(),
        E::BinOp(x) => x.span(),
        E::Compare(x) => x.span(),
        E::IfExpr(x) => x.span(),
        E::Filter(x) => x.span(),
        E::Test(x) => x.span(),
        E::GetAttr(x) => x.span(),
        E::GetItem(x) => x.span(),
        E::Call(x) => x.span(),
        E::List(x) => x.span(),
        E::Tuple(x) => x.span(),
        E::Map(x) => x.span(),
    })
}

fn walk_args(args: &[ast::CallArg<'_>], out: &mut dyn FnMut(&ast::Expr<'_>)) {
    for a in args {
        match a {
            ast::CallArg::Pos(e)
            | ast::CallArg::Kwarg(_, e)
            | ast::CallArg::PosSplat(e)
            | ast::CallArg::KwargSplat(e) => walk_expr(e, out),
        }
    }
}

fn walk_exprs<'a>(
    exprs: impl IntoIterator<Item = &'a ast::Expr<'a>>,
    out: &mut dyn FnMut(&ast::Expr<'_>),
) {
    for e in exprs {
        walk_expr(e, out);
    }
}

/// The guard call an operator node becomes, if it is one of `*`, `+`, `~`.
fn op_of(e: &ast::Expr<'_>) -> Option<Op> {
    let ast::Expr::BinOp(x) = e else {
        return None;
    };
    let guard = match x.op {
        ast::BinOpKind::Mul => MUL,
        ast::BinOpKind::Add => ADD,
        ast::BinOpKind::Concat => CONCAT,
        _ => return None,
    };
    let (start, end) = expr_span(e);
    Some(Op {
        start,
        end,
        guard,
        left: expr_span(&x.left),
        right: expr_span(&x.right),
    })
}

/// Calls `out` on `e` and on every expression inside it.
fn walk_expr(e: &ast::Expr<'_>, out: &mut dyn FnMut(&ast::Expr<'_>)) {
    out(e);
    children(e, &mut |c| walk_expr(c, out));
}

fn walk_body(body: &[ast::Stmt<'_>], out: &mut dyn FnMut(&ast::Expr<'_>)) {
    for s in body {
        walk_stmt(s, out);
    }
}

fn walk_macro(m: &ast::Macro<'_>, out: &mut dyn FnMut(&ast::Expr<'_>)) {
    walk_exprs(&m.args, out);
    walk_exprs(&m.defaults, out);
    walk_body(&m.body, out);
}

fn walk_stmt(s: &ast::Stmt<'_>, out: &mut dyn FnMut(&ast::Expr<'_>)) {
    use ast::Stmt as S;
    match s {
        S::Template(x) => walk_body(&x.children, out),
        S::EmitExpr(x) => walk_expr(&x.expr, out),
        S::EmitRaw(_) => {}
        S::ForLoop(x) => {
            walk_expr(&x.target, out);
            walk_expr(&x.iter, out);
            if let Some(f) = &x.filter_expr {
                walk_expr(f, out);
            }
            walk_body(&x.body, out);
            walk_body(&x.else_body, out);
        }
        S::IfCond(x) => {
            walk_expr(&x.expr, out);
            walk_body(&x.true_body, out);
            walk_body(&x.false_body, out);
        }
        S::WithBlock(x) => {
            for (target, value) in &x.assignments {
                walk_expr(target, out);
                walk_expr(value, out);
            }
            walk_body(&x.body, out);
        }
        S::Set(x) => {
            walk_expr(&x.target, out);
            walk_expr(&x.expr, out);
        }
        S::SetBlock(x) => {
            walk_expr(&x.target, out);
            if let Some(f) = &x.filter {
                walk_expr(f, out);
            }
            walk_body(&x.body, out);
        }
        S::AutoEscape(x) => {
            walk_expr(&x.enabled, out);
            walk_body(&x.body, out);
        }
        S::FilterBlock(x) => {
            walk_expr(&x.filter, out);
            walk_body(&x.body, out);
        }
        S::Block(x) => walk_body(&x.body, out),
        S::Import(x) => {
            walk_expr(&x.expr, out);
            walk_expr(&x.name, out);
        }
        S::FromImport(x) => {
            walk_expr(&x.expr, out);
            for (name, alias) in &x.names {
                walk_expr(name, out);
                if let Some(a) = alias {
                    walk_expr(a, out);
                }
            }
        }
        S::Extends(x) => walk_expr(&x.name, out),
        S::Include(x) => walk_expr(&x.name, out),
        S::Macro(x) => walk_macro(x, out),
        S::CallBlock(x) => {
            walk_expr(&x.call.expr, out);
            walk_args(&x.call.args, out);
            walk_macro(&x.macro_decl, out);
        }
        S::Do(x) => {
            walk_expr(&x.call.expr, out);
            walk_args(&x.call.args, out);
        }
        // `continue` and `break`, when minijinja is built with loop controls.
        #[allow(unreachable_patterns)]
        _ => {}
    }
}

/// Writes `src[start..end]` with every operator in it replaced by its
/// guard's call. `ops` is sorted by start, outer before inner.
fn emit(src: &str, (start, end): (usize, usize), ops: &[Op], out: &mut String) -> Option<()> {
    let mut pos = start;
    for op in ops.iter().filter(|op| op.start >= start && op.end <= end) {
        if op.start < pos {
            continue;
        }
        let inside = |(s, e): (usize, usize)| op.start <= s && s <= e && e <= op.end;
        if !inside(op.left) || !inside(op.right) || op.left.1 > op.right.0 {
            return None;
        }
        out.push_str(src.get(pos..op.start)?);
        out.push_str(op.guard);
        out.push('(');
        emit(src, op.left, ops, out)?;
        out.push_str(", ");
        emit(src, op.right, ops, out)?;
        out.push(')');
        pos = op.end;
    }
    out.push_str(src.get(pos..end)?);
    Some(())
}

fn rewrite(src: &str, mut ops: Vec<Op>) -> Result<String, Error> {
    if ops.is_empty() {
        return Ok(src.to_owned());
    }
    ops.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    let mut out = String::with_capacity(src.len() + ops.len() * 24);
    emit(src, (0, src.len()), &ops, &mut out).ok_or_else(|| {
        Error::new(
            ErrorKind::SyntaxError,
            "the operators could not be located in the source",
        )
    })?;
    Ok(out)
}

/// The template `source` with its operators guarded.
///
/// # Errors
///
/// The template does not parse.
pub(super) fn guard_template(name: &str, source: &str) -> Result<String, Error> {
    let tree = parse(source, name, SyntaxConfig::default())?;
    let mut ops = Vec::new();
    walk_stmt(&tree, &mut |e| ops.extend(op_of(e)));
    rewrite(source, ops)
}

/// The expression `expr` with its operators guarded.
///
/// # Errors
///
/// The expression does not parse.
pub(super) fn guard_expr(expr: &str) -> Result<String, Error> {
    let tree = parse_expr(expr)?;
    let mut ops = Vec::new();
    walk_expr(&tree, &mut |e| ops.extend(op_of(e)));
    rewrite(expr, ops)
}

/// The filters and tests a template or expression names that `env` does
/// not have, as messages (`unknown filter `x``). minijinja looks filters
/// and tests up by name only when it runs into them, so without this an
/// unknown one would fail the first session that reaches it; their names
/// are in the source, so a flow naming one does not load.
fn unknown_names(
    env: &Environment<'_>,
    visit: impl FnOnce(&mut dyn FnMut(&ast::Expr<'_>)),
) -> Vec<String> {
    let mut named: Vec<(&'static str, String)> = Vec::new();
    visit(&mut |e| match e {
        ast::Expr::Filter(x) => named.push(("filter", x.name.to_owned())),
        ast::Expr::Test(x) => named.push(("test", x.name.to_owned())),
        _ => {}
    });
    let mut state = env.empty_state();
    let mut out: Vec<String> = Vec::new();
    for (what, name) in named {
        // As minijinja looks them up: without whitespace.
        let name: String = name.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        // Called without arguments, a filter or test that exists fails
        // (or answers) for any other reason; nothing but the lookup runs.
        let found = match what {
            "filter" => state.apply_filter(&name, &[]).map(drop),
            _ => state.perform_test(&name, &[]).map(drop),
        };
        let unknown = matches!(&found, Err(e) if matches!(e.kind(), ErrorKind::UnknownFilter | ErrorKind::UnknownTest));
        let message = format!("unknown {what} `{name}`");
        if unknown && !out.contains(&message) {
            out.push(message);
        }
    }
    out
}

/// The filters and tests the template `source` names that `env` lacks.
///
/// # Errors
///
/// The template does not parse.
pub(super) fn unknown_in_template(
    env: &Environment<'_>,
    name: &str,
    source: &str,
) -> Result<Vec<String>, Error> {
    let tree = parse(source, name, SyntaxConfig::default())?;
    Ok(unknown_names(env, |f| walk_stmt(&tree, f)))
}

/// The filters and tests the expression `expr` names that `env` lacks.
///
/// # Errors
///
/// The expression does not parse.
pub(super) fn unknown_in_expr(env: &Environment<'_>, expr: &str) -> Result<Vec<String>, Error> {
    let tree = parse_expr(expr)?;
    Ok(unknown_names(env, |f| walk_expr(&tree, f)))
}

#[cfg(test)]
mod tests {
    //! Run-time template and expression failures are the data's doing and
    //! change nothing; what a template builds is bounded before it is built.

    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::Timestamp;
    use crate::flow::{
        Condition, Flow, FlowBuilder, FlowCommand, FlowContext, FlowError, FlowKey, FlowRecord,
        FlowSessionId, MAX_RENDER_BYTES, RunnerOptions, TransitionDef,
    };
    use crate::id::ProductId;
    use crate::machine::{ErrorClass, Machine, MachineError};

    fn now() -> Timestamp {
        Timestamp::from_micros(1_767_225_600_000_000).unwrap()
    }

    fn ctx(flow: Flow) -> FlowContext {
        FlowContext::new(Arc::new(flow), RunnerOptions::default())
    }

    /// `a` --go--> `b`, `b` rendering `b`, the transition with `cond` and
    /// `assign` (into the model field `n`).
    fn flow_with(b: &str, cond: Option<&str>, assign: Option<&str>) -> FlowContext {
        let mut go = TransitionDef::new("go", "a", "b");
        if let Some(c) = cond {
            go.cond = vec![Condition::Expr(c.into())];
        }
        if let Some(a) = assign {
            go.assign = vec![("n".to_owned(), a.to_owned())];
        }
        ctx(FlowBuilder::new("t")
            .template("a.j2", "a")
            .template("b.j2", b)
            .field("n", json!(0))
            .user_state("a", "a.j2")
            .user_state("b", "b.j2")
            .transition(go)
            .build()
            .unwrap())
    }

    /// Fires `go` with `input` on a new session: it must be refused with
    /// the record exactly as it was.
    fn refused(c: &FlowContext, input: &str) -> FlowError {
        let key = FlowKey::new(
            ProductId::parse("acme").unwrap(),
            FlowSessionId::parse("s1").unwrap(),
        );
        let mut r = FlowRecord::create(&key, c, &FlowCommand::start(), now())
            .unwrap()
            .expect("start creates")
            .0;
        let before = r.clone();
        let cmd = FlowCommand::Fire {
            event: "go".into(),
            input: input.into(),
            fresh_id: "x".into(),
        };
        let e = r.decide(c, &cmd, now()).expect_err("refused");
        assert_eq!(r, before, "a refusal changes nothing");
        e
    }

    fn is_template_error(e: &FlowError) -> bool {
        matches!(e, FlowError::Template { what, .. } if what == "b.j2")
            && e.class() == ErrorClass::Invalid
    }

    fn is_value_limit(e: &FlowError, what: &str) -> bool {
        matches!(e, FlowError::RenderLimit { what: w, limit } if w == what && *limit == bytes_limit())
            && e.class() == ErrorClass::LimitExceeded
    }

    #[test]
    fn int_on_text_in_a_template_is_invalid_input_not_internal() {
        let e = refused(
            &flow_with("{{ actor_input | int + 1 }}", None, None),
            "text",
        );
        assert!(is_template_error(&e), "{e:?}");
    }

    #[test]
    fn int_on_text_in_a_condition_is_an_invalid_expression() {
        let e = refused(
            &flow_with("b", Some("(actor_input | int) > 0"), None),
            "text",
        );
        assert!(
            matches!(&e, FlowError::Expression { .. }) && e.class() == ErrorClass::Invalid,
            "{e:?}"
        );
    }

    #[test]
    fn a_division_by_zero_on_the_input_is_invalid_input() {
        let e = refused(
            &flow_with("{{ 10 // (actor_input | length) }}", None, None),
            "",
        );
        assert!(is_template_error(&e), "{e:?}");
    }

    #[test]
    fn a_filter_on_the_wrong_type_is_invalid_input() {
        let e = refused(
            &flow_with("{{ parsed_actor_input | batch(2) | list }}", None, None),
            "3",
        );
        assert!(is_template_error(&e), "{e:?}");
    }

    #[test]
    fn an_assign_calling_an_unknown_function_is_an_invalid_expression() {
        let e = refused(&flow_with("b", None, Some("no_such_function(1)")), "x");
        assert!(
            matches!(&e, FlowError::Expression { expr, .. } if expr == "no_such_function(1)")
                && e.class() == ErrorClass::Invalid,
            "{e:?}"
        );
    }

    #[test]
    fn an_unknown_filter_or_test_named_by_the_data_is_invalid_input() {
        for template in [
            "{{ [1] | map(actor_input) | list }}",
            "{{ [1] | select(actor_input) | list }}",
            "{% include actor_input %}",
        ] {
            let e = refused(&flow_with(template, None, None), "no_such_name");
            assert!(is_template_error(&e), "{template}: {e:?}");
        }
    }

    #[test]
    fn a_string_repeated_past_the_limit_is_refused_in_a_template_a_condition_and_an_assign() {
        for n in ["10**9", "100000000", &(MAX_VALUE_BYTES + 1).to_string()] {
            let repeat = format!("'x' * {n}");
            let e = refused(&flow_with(&format!("{{{{ {repeat} }}}}"), None, None), "");
            assert!(is_value_limit(&e, "b.j2"), "{n}: {e:?}");
            let cond = format!("({repeat}) | length > 0");
            let e = refused(&flow_with("b", Some(&cond), None), "");
            assert!(is_value_limit(&e, &cond), "{n}: {e:?}");
            let e = refused(&flow_with("b", None, Some(&repeat)), "");
            assert!(is_value_limit(&e, &repeat), "{n}: {e:?}");
        }
        // The input is repeated the same way, on either side.
        let e = refused(&flow_with("{{ 100000000 * actor_input }}", None, None), "x");
        assert!(is_value_limit(&e, "b.j2"), "{e:?}");
    }

    #[test]
    fn guarded_templates_render_what_minijinja_renders() {
        let data = minijinja::context! { n => 3, s => "ab", l => vec![1, 2], none => () };
        let plain = Environment::new();
        let mut guarded = Environment::new();
        install(&mut guarded);
        for t in [
            "{{ ('x' * 1048576) | length }}",
            "{{ [1, 2] * 2 }} {{ 2 * [1] }} {{ s * 2 }} {{ 2 * s }} {{ 'ab' * 0 }} {{ 2.5 * 2 }}",
            "{{ 'a' ~ 1 ~ none }} {{ s ~ l }} {{ undefined_name ~ s }} {{ 7 | string ~ '!' }}",
            "{{ 'a' + 'b' }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ [1] + [2] }} {{ (1,) + (2,) }}",
            "{{ -2 * -3 }} {{ n * n ** 2 }} {{ 1 + 2 if n > 2 else 3 * 4 }} {{ l[0] + l[1] }}",
            "{{ range(3) | join('-') }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }}",
            "{{ l | map('string') | join(', ') }} {{ s | join('.') }} {{ (l + l) | sum }}",
            "{% set ns = namespace(t=0) %}{% for i in range(n) %}{% set ns.t = ns.t + i * 2 %}{% endfor %}{{ ns.t }}",
            "{% macro m(a, b=1 + 1) %}{{ a ~ b }}{% endmacro %}{{ m('x') }}{{ m('y', b=n * 2) }}",
            "{{ {'k': n + 1}['k'] * 2 }} {{ s[0] ~ s[1:] * 2 }} {{ (s ~ s) | upper }} {{ s is string and n + 1 > 3 }}",
            "{%- if n * 2 == 6 %} six {% endif -%} {{ l | selectattr('real') | list + [n] }}",
        ] {
            let want = plain.render_str(t, &data).unwrap();
            let rewritten = guard_template("t", t).unwrap();
            let got = guarded.render_str(&rewritten, &data).unwrap();
            assert_eq!(got, want, "{t} -> {rewritten}");
        }
        let e = minijinja::context! { n => 2 };
        for x in [
            "n * 2 + 1",
            "(n + 1) * 2",
            "[n] * 3",
            "'a' ~ n * 2",
            "n ~ n ~ n",
        ] {
            let want = plain.compile_expression(x).unwrap().eval(&e).unwrap();
            let rewritten = guard_expr(x).unwrap();
            let got = guarded
                .compile_expression(&rewritten)
                .unwrap()
                .eval(&e)
                .unwrap();
            assert_eq!(got, want, "{x} -> {rewritten}");
        }
    }

    #[test]
    fn concatenation_and_addition_past_the_limit_are_refused() {
        let half = MAX_VALUE_BYTES / 2 + 1;
        for t in [
            format!("{{% set s = 'x' * {half} %}}{{{{ (s ~ s) | length }}}}"),
            format!("{{% set s = 'x' * {half} %}}{{{{ (s + s) | length }}}}"),
            format!("{{% set s = 'x' * {half} %}}{{{{ ([s] ~ s) | length }}}}"),
        ] {
            let e = refused(&flow_with(&t, None, None), "");
            assert!(is_value_limit(&e, "b.j2"), "{t}: {e:?}");
        }
    }

    #[test]
    fn lists_past_the_item_limit_are_refused() {
        let n = MAX_SEQUENCE_ITEMS + 1;
        let limit = items_limit();
        for t in [
            format!("{{{{ ([0] * {n}) | length }}}}"),
            "{{ ([0] * 100000000) | length }}".to_owned(),
            format!(
                "{{{{ (([0] * {}) + [1, 2]) | length }}}}",
                MAX_SEQUENCE_ITEMS
            ),
            format!("{{{{ range({n}) | length }}}}"),
            format!("{{{{ range(0, {n} * 2, 2) | length }}}}"),
        ] {
            let e = refused(&flow_with(&t, None, None), "");
            assert!(
                matches!(&e, FlowError::RenderLimit { limit: l, .. } if *l == limit),
                "{t}: {e:?}"
            );
        }
        assert!(matches!(
            refused(&flow_with("b", None, Some(&format!("[0] * {n}"))), ""),
            FlowError::RenderLimit { limit: l, .. } if l == limit
        ));
    }

    #[test]
    fn join_and_string_past_the_limit_are_refused() {
        let big = MAX_VALUE_BYTES / 4;
        for t in [
            format!("{{% set s = 'x' * {big} %}}{{{{ [s, s, s, s, s] | join | length }}}}"),
            format!("{{% set s = 'x' * {big} %}}{{{{ [s, s, s, s] | join(',') | length }}}}"),
            format!("{{% set s = 'x' * {big} %}}{{{{ [s, s, s, s, s] | string | length }}}}"),
        ] {
            let e = refused(&flow_with(&t, None, None), "");
            assert!(is_value_limit(&e, "b.j2"), "{t}: {e:?}");
        }
    }

    #[test]
    fn many_values_under_the_limit_are_bounded_by_the_evaluation_budget() {
        // Each string is under the per-value limit, but building a new one
        // on every iteration adds up past the evaluation's budget.
        let t = format!(
            "{{% set ns = namespace(l=[]) %}}{{% for i in range(1000) %}}\
             {{% set ns.l = ns.l + [('x' * {}) ~ i] %}}{{% endfor %}}",
            MAX_VALUE_BYTES - 10
        );
        let e = refused(&flow_with(&t, None, None), "");
        assert!(
            matches!(&e, FlowError::RenderLimit { limit, .. }
                if *limit == format!("{MAX_EVAL_BYTES} bytes per evaluation")),
            "{e:?}"
        );
        // The budget is per render: the next render starts afresh.
        let ok = flow_with("{{ ('x' * 1000) | length }}", None, None).flow;
        let s = ok
            .start(&FlowSessionId::parse("s").unwrap(), now())
            .unwrap()
            .session;
        assert!(ok.fire(&s, &[], "go", "", "x", now()).is_ok());
    }

    #[test]
    fn the_output_limit_still_holds() {
        let e = refused(
            &flow_with(
                "{% for i in range(2000) %}{{ 'x' * 1000 }}{% endfor %}",
                None,
                None,
            ),
            "",
        );
        assert!(
            matches!(&e, FlowError::RenderLimit { limit, .. }
                if *limit == format!("{MAX_RENDER_BYTES} bytes of output")),
            "{e:?}"
        );
    }

    #[test]
    fn the_rewrite_keeps_precedence_parentheses_and_text() {
        for (src, want) in [
            ("a * b", "__parlance_mul(a, b)"),
            ("a + b * c", "__parlance_add(a, __parlance_mul(b, c))"),
            ("(a + b) * c", "__parlance_mul(__parlance_add(a, b), c)"),
            ("x[(a * b)]", "x[(__parlance_mul(a, b))]"),
            ("a ~ b ~ c", "__parlance_concat(__parlance_concat(a, b), c)"),
            (
                "f(x * 2)|upper ~ 'a*b'",
                "__parlance_concat(f(__parlance_mul(x, 2))|upper, 'a*b')",
            ),
            ("a - b / c", "a - b / c"),
        ] {
            assert_eq!(guard_expr(src).unwrap(), want, "{src}");
        }
        let t = "{# a * b #}x{% raw %}{{ a * b }}{% endraw %}{% set y = [1] * 2 %}{{ y ~ 'é' }}";
        assert_eq!(
            guard_template("t", t).unwrap(),
            "{# a * b #}x{% raw %}{{ a * b }}{% endraw %}{% set y = __parlance_mul([1], 2) %}{{ __parlance_concat(y, 'é') }}"
        );
    }

    #[test]
    fn flows_that_do_not_parse_are_still_refused_when_loaded() {
        let e = FlowBuilder::new("t")
            .template("a.j2", "{{ 'x' * }}")
            .user_state("a", "a.j2")
            .build()
            .unwrap_err();
        assert!(matches!(e, FlowError::Invalid(_)), "{e:?}");
        let mut go = TransitionDef::new("go", "a", "a");
        go.cond = vec![Condition::Expr("1 * * 2".into())];
        let e = FlowBuilder::new("t")
            .template("a.j2", "a")
            .user_state("a", "a.j2")
            .transition(go)
            .build()
            .unwrap_err();
        assert!(matches!(e, FlowError::Invalid(_)), "{e:?}");
    }
}
