/**
 * The panel's view of `--background` runs (issue 30): a row per pending run
 * with its progress, the names it writes and when it started; the recent
 * ones with their outcome; the cancel request; the status bar's text.
 */

import * as fs from 'fs';
import * as path from 'path';

import { StateMessage, cancel, validate } from '../api';
import { backgroundView, clockText, statusText, viewModel } from '../view';

const fixture = JSON.parse(
  fs.readFileSync(
    path.resolve(__dirname, '../../../../tests/fixtures/panel_v1.json'),
    'utf-8'
  )
);
const WITH_BG: StateMessage = fixture.valid.find(
  (m: StateMessage) => m.type === 'state' && m.background
);

describe('background runs in the panel', () => {
  it('the fixture state with background runs is valid', () => {
    expect(WITH_BG).toBeDefined();
    expect(validate(WITH_BG)).toEqual([]);
  });

  it('shows each pending run: progress, names it writes, start time', () => {
    const v = backgroundView(WITH_BG.background)!;
    expect(v.title).toBe('1 background run pending');
    expect(v.pending).toEqual([
      {
        cell: 5,
        state: 'running',
        pct: (37 / 120) * 100,
        text: 'cell [5]: 37 of 120 iterations (30%), 12.3 s, running',
        writes: 'writes out, total',
        started: `started ${clockText(1795000000.0)}`,
        note: ''
      }
    ]);
    expect(clockText(1795000000.0)).toMatch(/^\d\d:\d\d:\d\d$/);
  });

  it('shows the recent ones newest first with their outcome, failures marked', () => {
    const v = backgroundView(WITH_BG.background)!;
    expect(v.recent.map(r => [r.cell, r.outcome, r.error])).toEqual([
      [4, 'merged', false],
      [3, 'failed', true],
      [2, 'cancelled', false]
    ]);
    expect(v.recent[1].text).toContain('ValueError: bad row');
  });

  it('is null without runs, titled apart when none is pending', () => {
    expect(backgroundView(null)).toBeNull();
    expect(backgroundView(undefined)).toBeNull();
    expect(backgroundView({ pending: [], recent: [] })).toBeNull();
    const ended = backgroundView({
      pending: [],
      recent: WITH_BG.background!.recent
    })!;
    expect(ended.title).toBe('Background runs');
    expect(ended.pending).toEqual([]);
  });

  it('a run with nothing to do yet, or ended with no total, has a sane bar', () => {
    const p = { ...WITH_BG.background!.pending[0], total: 0, done: 0 };
    expect(backgroundView({ pending: [p], recent: [] })!.pending[0].pct).toBe(
      0
    );
    const ended = { ...p, state: 'finished' };
    expect(
      backgroundView({ pending: [ended], recent: [] })!.pending[0].pct
    ).toBe(100);
    const two = backgroundView({
      pending: [p, { ...p, cell: 6 }],
      recent: []
    })!;
    expect(two.title).toBe('2 background runs pending');
  });

  it('is part of the view model; the status bar says the kernel’s text', () => {
    const snap = { phase: 'loaded' as const, state: WITH_BG, reply: null };
    const vm = viewModel(snap);
    expect(vm.background?.pending[0].cell).toBe(5);
    expect(statusText(snap)).toBe(
      'gpucell: 2 CPU engines · 1 host · 50% busy · 1 background run 30%'
    );
    // a kernel older than --background sends no key: no section
    const old = { ...WITH_BG } as Record<string, unknown>;
    delete old.background;
    expect(
      viewModel({ ...snap, state: old as unknown as StateMessage }).background
    ).toBeNull();
  });

  it('the cancel button asks for the run’s own cancel()', () => {
    expect(cancel(5)).toEqual({ v: 1, type: 'cancel', cell: 5 });
    expect(validate(cancel(5))).toEqual([]);
    expect(validate({ v: 1, type: 'cancel', cell: 'x' })).not.toEqual([]);
  });
});
