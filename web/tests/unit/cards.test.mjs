// The shared card-rule table (web/cards.cases.json) on the module the browser loads.
// `subflow tail`'s Rust port runs the same table (crates/subflow-contracts/tests/task_card.rs).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import * as cards from "../../assets/cards.mjs";

const root = new URL("../../../", import.meta.url);
const table = JSON.parse(readFileSync(new URL("web/cards.cases.json", root), "utf8"));

// JSON-equal: what the Rust port serialises is compared the same way.
const asJson = (value) => (value === undefined ? undefined : JSON.parse(JSON.stringify(value)));

for (const { fn, name, args, expected } of table.cases) {
  test(`${fn}: ${name}`, () => {
    assert.equal(typeof cards[fn], "function", `cards.mjs exports ${fn}`);
    assert.deepEqual(asJson(cards[fn](...args)), expected);
  });
}

test("every exported rule has at least one case", () => {
  const covered = new Set(table.cases.map((c) => c.fn));
  const functions = Object.entries(cards)
    .filter(([, value]) => typeof value === "function")
    .map(([key]) => key);
  assert.deepEqual(functions.filter((f) => !covered.has(f)), []);
});

test("the status and stop-reason lists equal the contract file", () => {
  const contract = JSON.parse(
    readFileSync(new URL("contracts/subagent_status_contract.json", root), "utf8"),
  );
  assert.equal(contract.version, 2);
  assert.deepEqual([...cards.SUBAGENT_STATUSES], contract.valid_status_values);
  assert.deepEqual([...cards.SUBAGENT_STOP_REASONS], contract.valid_stop_reason_values);
});

test("merging never mutates its inputs", () => {
  const card = cards.newCard("call_1");
  const frozen = JSON.stringify(card);
  const update = { status: "completed", toolMessage: true, steps: [] };
  cards.mergeCard(card, update);
  assert.equal(JSON.stringify(card), frozen);
});
