-- Per-user adoption state, compare-and-swap on version.
-- `snapshot` is `json`, not `jsonb`: it keeps the key order of the
-- workflow-progress maps, which the derived id lists follow.
CREATE TABLE adoption_state (
    product_id    text        NOT NULL,
    user_id       text        NOT NULL,
    version       bigint      NOT NULL CHECK (version > 0),
    journey_state text        NOT NULL,
    mastery_level text        NOT NULL,
    snapshot      json        NOT NULL,
    updated_at    timestamptz NOT NULL,
    PRIMARY KEY (product_id, user_id)
);

-- Onboarding plans per product; `role` is the trimmed, lowercased role, or
-- '' for the product-wide plan.
CREATE TABLE adoption_plan (
    product_id text  NOT NULL,
    role       text  NOT NULL,
    config     jsonb NOT NULL,
    PRIMARY KEY (product_id, role)
);

-- Tour catalogs per product and role, keyed like plans.
CREATE TABLE adoption_tour_catalog (
    product_id text  NOT NULL,
    role       text  NOT NULL,
    catalog    jsonb NOT NULL,
    PRIMARY KEY (product_id, role)
);
