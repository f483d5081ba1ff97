//! [`turn_state!`](crate::turn_state): declares a typed turn state.

/// Declares a turn state: the state struct, its input view, its loaded view,
/// the delta stages return, and the [`TurnState`](crate::turn::TurnState)
/// implementation with the listable schema.
///
/// ```
/// use parlance_core::turn_state;
///
/// turn_state! {
///     /// A tiny state.
///     pub struct Tiny {
///         input TinyInput {
///             /// The user's message.
///             message: String, by ["caller"];
///         }
///         loaded TinyLoaded {
///             /// Facts from the memory store.
///             facts: Vec<String> => last, by ["memory context"];
///         }
///         reducer {
///             /// Every message so far.
///             history: Vec<String> => append, by ["begin_turn", "finalize"];
///             /// Named counters.
///             counters: std::collections::BTreeMap<String, i64> => merge, by ["count"];
///         }
///         turn_scoped {
///             /// The reply.
///             reply: String as "reply.text" => last, by ["reply"];
///         }
///         delta TinyDelta;
///     }
/// }
///
/// let schema = <Tiny as parlance_core::turn::TurnState>::schema();
/// assert_eq!(schema.fields.len(), 5);
/// assert_eq!(schema.fields[4].name, "reply.text");
/// ```
///
/// Reducers are `append` (the field must be a `Vec`; its delta slot is a
/// `Vec` of new entries), `window(source, N)` (a reducer field holding the
/// last `N` entries of the `append` field `source`, which must not be
/// renamed: it is served from the source's stored entries, never stored
/// itself, and follows every write to the source), `merge` (the type implements
/// [`Merge`](crate::turn::Merge); the slot is an `Option`) and `last` (the
/// slot is an `Option`; two writers in one step are an error). Reducer
/// fields must be serde-serializable and `Default`. Input, loaded and
/// turn-scoped fields must be `Default`, `Serialize` and `Deserialize`: an
/// interrupted turn keeps them as JSON
/// ([`TurnState::suspend`](crate::turn::TurnState::suspend)) until it is
/// resumed ([`TurnState::resume_from`](crate::turn::TurnState::resume_from)).
/// `as "name"` sets the schema name (dotted leaves of a group).
#[macro_export]
macro_rules! turn_state {
    (
        $(#[$meta:meta])*
        $vis:vis struct $State:ident {
            input $Input:ident {
                $( $(#[doc = $idoc:literal])* $ifield:ident : $ity:ty $(as $iwire:literal)? , by [$($iw:literal),* $(,)?] ; )*
            }
            loaded $Loaded:ident {
                $( $(#[doc = $ldoc:literal])* $lfield:ident : $lty:ty $(as $lwire:literal)? => $lred:ident , by [$($lw:literal),* $(,)?] ; )*
            }
            reducer {
                $( $(#[doc = $rdoc:literal])* $rfield:ident : $rty:ty $(as $rwire:literal)? => $rred:ident $(($rsrc:ident, $rn:literal))? , by [$($rw:literal),* $(,)?] ; )*
            }
            turn_scoped {
                $( $(#[doc = $tdoc:literal])* $tfield:ident : $tty:ty $(as $twire:literal)? => $tred:ident , by [$($tw:literal),* $(,)?] ; )*
            }
            delta $Delta:ident;
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        $vis struct $State {
            $( $(#[doc = $idoc])* pub $ifield: $ity, )*
            $( $(#[doc = $ldoc])* pub $lfield: $lty, )*
            $( $(#[doc = $rdoc])* pub $rfield: $rty, )*
            $( $(#[doc = $tdoc])* pub $tfield: $tty, )*
            #[doc(hidden)]
            pub __book: $crate::turn::TurnBook,
        }

        #[doc = concat!("The caller-set fields of [`", stringify!($State), "`].")]
        #[derive(Debug, Clone, Default, PartialEq)]
        $vis struct $Input {
            $( $(#[doc = $idoc])* pub $ifield: $ity, )*
        }

        #[doc = concat!("The fields of [`", stringify!($State), "`] fetched from the memory store each turn.")]
        #[derive(Debug, Clone, Default, PartialEq)]
        $vis struct $Loaded {
            $( $(#[doc = $ldoc])* pub $lfield: $lty, )*
        }

        #[doc = concat!("What a stage of [`", stringify!($State), "`] writes: one slot per non-input field.")]
        #[derive(Debug, Clone, Default, PartialEq)]
        $vis struct $Delta {
            $( $(#[doc = $ldoc])* pub $lfield: $crate::__turn_slot!($lred, $lty), )*
            $( $(#[doc = $rdoc])* pub $rfield: $crate::__turn_slot!($rred, $rty), )*
            $( $(#[doc = $tdoc])* pub $tfield: $crate::__turn_slot!($tred, $tty), )*
        }

        impl $crate::turn::TurnState for $State {
            type Input = $Input;
            type Loaded = $Loaded;
            type Delta = $Delta;

            fn schema() -> &'static $crate::turn::Schema {
                static SCHEMA: $crate::turn::Schema = $crate::turn::Schema {
                    name: stringify!($State),
                    fields: &[
                        $( $crate::turn::FieldSpec {
                            name: $crate::__turn_wire!($ifield $(, $iwire)?),
                            ty: stringify!($ity),
                            lifecycle: $crate::turn::Lifecycle::Input,
                            reducer: None,
                            view_of: None,
                            writers: &[$($iw),*],
                            doc: &[$($idoc),*],
                        }, )*
                        $( $crate::turn::FieldSpec {
                            name: $crate::__turn_wire!($lfield $(, $lwire)?),
                            ty: stringify!($lty),
                            lifecycle: $crate::turn::Lifecycle::Loaded,
                            reducer: Some($crate::turn::Reducer::__from_ident(stringify!($lred))),
                            view_of: None,
                            writers: &[$($lw),*],
                            doc: &[$($ldoc),*],
                        }, )*
                        $( $crate::turn::FieldSpec {
                            name: $crate::__turn_wire!($rfield $(, $rwire)?),
                            ty: stringify!($rty),
                            lifecycle: $crate::turn::Lifecycle::Reducer,
                            reducer: Some($crate::turn::Reducer::__from_ident(stringify!($rred))),
                            view_of: $crate::__turn_view_of!($(($rsrc, $rn))?),
                            writers: &[$($rw),*],
                            doc: &[$($rdoc),*],
                        }, )*
                        $( $crate::turn::FieldSpec {
                            name: $crate::__turn_wire!($tfield $(, $twire)?),
                            ty: stringify!($tty),
                            lifecycle: $crate::turn::Lifecycle::TurnScoped,
                            reducer: Some($crate::turn::Reducer::__from_ident(stringify!($tred))),
                            view_of: None,
                            writers: &[$($tw),*],
                            doc: &[$($tdoc),*],
                        }, )*
                    ],
                };
                &SCHEMA
            }

            fn restore(
                checkpoint: &$crate::turn::Checkpoint,
                input: $Input,
                loaded: $Loaded,
            ) -> ::std::result::Result<Self, $crate::turn::TurnError> {
                let mut book = $crate::turn::TurnBook::new(checkpoint.version);
                let _ = &mut book;
                ::std::result::Result::Ok(Self {
                    $( $ifield: input.$ifield, )*
                    $( $lfield: loaded.$lfield, )*
                    $( $rfield: $crate::__turn_restore!(
                        $rred $(($rsrc, $rn))?, checkpoint, $crate::__turn_wire!($rfield $(, $rwire)?), &mut book
                    )?, )*
                    $( $tfield: ::std::default::Default::default(), )*
                    __book: book,
                })
            }

            fn apply(
                &mut self,
                writes: ::std::vec::Vec<(&'static str, $Delta)>,
            ) -> ::std::result::Result<(), $crate::turn::TurnError> {
                // Check every last-value field first, so a conflict applies nothing.
                $( $crate::__turn_check!($lred, &writes, $crate::__turn_wire!($lfield $(, $lwire)?), $lfield); )*
                $( $crate::__turn_check!($rred, &writes, $crate::__turn_wire!($rfield $(, $rwire)?), $rfield); )*
                $( $crate::__turn_check!($tred, &writes, $crate::__turn_wire!($tfield $(, $twire)?), $tfield); )*
                for (_stage, d) in writes {
                    // Windows follow their source list before it is moved.
                    $( $crate::__turn_view!($rred $(($rsrc, $rn))?, &mut self.$rfield, &d); )*
                    $( $crate::__turn_apply!($lred, &mut self.$lfield, d.$lfield); )*
                    $(
                        if $crate::__turn_apply!($rred, &mut self.$rfield, d.$rfield) {
                            $crate::turn::__mark_dirty(
                                &mut self.__book,
                                $crate::__turn_wire!($rfield $(, $rwire)?),
                            );
                        }
                    )*
                    $( $crate::__turn_apply!($tred, &mut self.$tfield, d.$tfield); )*
                }
                ::std::result::Result::Ok(())
            }

            fn checkpoint_delta(
                &self,
            ) -> ::std::result::Result<$crate::turn::CheckpointDelta, $crate::turn::TurnError> {
                let mut delta = $crate::turn::CheckpointDelta::default();
                let _ = &mut delta;
                $( $crate::__turn_persist!(
                    $rred, &self.$rfield, $crate::__turn_wire!($rfield $(, $rwire)?), &self.__book, &mut delta
                )?; )*
                ::std::result::Result::Ok(delta)
            }

            fn book(&self) -> &$crate::turn::TurnBook {
                &self.__book
            }

            fn suspend(
                &self,
            ) -> ::std::result::Result<$crate::turn::__SuspendedValue, $crate::turn::TurnError> {
                let mut into = $crate::turn::__Suspended::new();
                let _ = &mut into;
                $( $crate::turn::__suspend_field(&mut into, $crate::__turn_wire!($ifield $(, $iwire)?), &self.$ifield)?; )*
                $( $crate::turn::__suspend_field(&mut into, $crate::__turn_wire!($lfield $(, $lwire)?), &self.$lfield)?; )*
                $( $crate::turn::__suspend_field(&mut into, $crate::__turn_wire!($tfield $(, $twire)?), &self.$tfield)?; )*
                ::std::result::Result::Ok($crate::turn::__SuspendedValue::Object(into))
            }

            fn resume_from(
                checkpoint: &$crate::turn::Checkpoint,
                suspended: &$crate::turn::__SuspendedValue,
            ) -> ::std::result::Result<Self, $crate::turn::TurnError> {
                let mut book = $crate::turn::TurnBook::new(checkpoint.version);
                let _ = &mut book;
                ::std::result::Result::Ok(Self {
                    $( $ifield: $crate::turn::__unsuspend_field(suspended, $crate::__turn_wire!($ifield $(, $iwire)?))?, )*
                    $( $lfield: $crate::turn::__unsuspend_field(suspended, $crate::__turn_wire!($lfield $(, $lwire)?))?, )*
                    $( $rfield: $crate::__turn_restore!(
                        $rred $(($rsrc, $rn))?, checkpoint, $crate::__turn_wire!($rfield $(, $rwire)?), &mut book
                    )?, )*
                    $( $tfield: $crate::turn::__unsuspend_field(suspended, $crate::__turn_wire!($tfield $(, $twire)?))?, )*
                    __book: book,
                })
            }

            fn load_window() -> $crate::turn::LoadWindow {
                let mut window = $crate::turn::LoadWindow::all();
                $( $crate::__turn_load_window!($rred $(($rsrc, $rn))?, &mut window); )*
                window
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __turn_wire {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident, $wire:literal) => {
        $wire
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __turn_slot {
    (append, $t:ty) => { $t };
    (window, $t:ty) => { $crate::turn::ViewOnly };
    (merge, $t:ty) => { ::std::option::Option<$t> };
    (last, $t:ty) => { ::std::option::Option<$t> };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __turn_check {
    (last, $writes:expr, $wire:expr, $field:ident) => {
        $crate::turn::__check_last($writes, $wire, |d| d.$field.is_some())?
    };
    ($other:ident, $writes:expr, $wire:expr, $field:ident) => {};
}

#[doc(hidden)]
#[macro_export]
macro_rules! __turn_apply {
    (append, $target:expr, $write:expr) => {
        $crate::turn::__apply_append($target, $write)
    };
    (merge, $target:expr, $write:expr) => {
        $crate::turn::__apply_merge($target, $write)
    };
    (last, $target:expr, $write:expr) => {
        $crate::turn::__apply_last($target, $write)
    };
    (window, $target:expr, $write:expr) => {{
        let _: $crate::turn::ViewOnly = $write;
        false
    }};
}

#[doc(hidden)]
#[macro_export]
macro_rules! __turn_view {
    (window ($src:ident, $n:literal), $target:expr, $d:expr) => {
        $crate::turn::__sync_window($target, &$d.$src, $n)
    };
    ($other:ident, $target:expr, $d:expr) => {};
}

#[doc(hidden)]
#[macro_export]
macro_rules! __turn_view_of {
    () => {
        None
    };
    (($src:ident, $n:literal)) => {
        Some((stringify!($src), $n))
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __turn_load_window {
    (window ($src:ident, $n:literal), $w:expr) => {
        $crate::turn::__widen_window($w, stringify!($src), $n)
    };
    ($other:ident, $w:expr) => {};
}

#[doc(hidden)]
#[macro_export]
macro_rules! __turn_restore {
    (append, $cp:expr, $wire:expr, $book:expr) => {
        $crate::turn::__restore_list($cp, $wire, $book)
    };
    (window ($src:ident, $n:literal), $cp:expr, $wire:expr, $book:expr) => {
        $crate::turn::__restore_window($cp, stringify!($src), $n)
    };
    ($other:ident, $cp:expr, $wire:expr, $book:expr) => {
        $crate::turn::__restore_object($cp, $wire)
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __turn_persist {
    (append, $value:expr, $wire:expr, $book:expr, $delta:expr) => {
        $crate::turn::__persist_list($value, $wire, $book, $delta)
    };
    (window, $value:expr, $wire:expr, $book:expr, $delta:expr) => {
        ::std::result::Result::<(), $crate::turn::TurnError>::Ok(())
    };
    ($other:ident, $value:expr, $wire:expr, $book:expr, $delta:expr) => {
        $crate::turn::__persist_object($value, $wire, $book, $delta)
    };
}
