/**
 * The side panel and the status-bar item: plain DOM, filled from a
 * {@link ViewModel} (see `view.ts`, where every decision is made).
 *
 * Elements are created once and updated in place; device rows are keyed by
 * engine, so a checkbox being clicked is never replaced under the pointer.
 */

import { Widget } from '@lumino/widgets';

import {
  BackgroundRunView,
  BackgroundView,
  ChartsView,
  DeviceView,
  ViewModel
} from './view';

/** What the panel's controls ask for. */
export interface PanelActions {
  start(args: string): void;
  stop(): void;
  select(ticks: Array<{ engine: number; checked: boolean }>): void;
  /** cancel the pending background run of cell [N] (its `cancel()`) */
  cancel(cell: number): void;
  /** show the last run's timeline large (a main-area tab) */
  openTimeline(src: string, title: string): void;
}

export const PANEL_ID = 'gpucell-panel';
export const PANEL_TITLE = 'GPU cluster';
export const TIMELINE_ID = 'gpucell-timeline-view';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls: string,
  parent?: HTMLElement
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  e.className = cls;
  if (parent) {
    parent.appendChild(e);
  }
  return e;
}

/** Set a node's text only when it changed (no needless DOM mutations). */
function setText(e: HTMLElement, text: string): void {
  if (e.textContent !== text) {
    e.textContent = text;
  }
}

function setAttr(e: HTMLElement, name: string, value: string | null): void {
  if (value === null) {
    e.removeAttribute(name);
  } else if (e.getAttribute(name) !== value) {
    e.setAttribute(name, value);
  }
}

function show(e: HTMLElement, visible: boolean): void {
  if (e.hidden === visible) {
    e.hidden = !visible;
  }
}

/** A horizontal bar: a fill of `pct`% and a text over it. */
class Bar {
  constructor(cls: string, parent: HTMLElement) {
    this.root = el('div', `gpucell-bar ${cls}`, parent);
    this.fill = el('div', 'gpucell-bar-fill', this.root);
    this.text = el('span', 'gpucell-bar-text', this.root);
  }

  update(pct: number | null, text: string): void {
    const width = `${(pct ?? 0).toFixed(1)}%`;
    if (this.fill.style.width !== width) {
      this.fill.style.width = width;
    }
    this.root.classList.toggle('gpucell-bar-none', pct === null);
    setText(this.text, text);
  }

  readonly root: HTMLDivElement;
  readonly fill: HTMLDivElement;
  readonly text: HTMLSpanElement;
}

/** One device's row: `div.gpucell-device[data-engine]`. */
class DeviceRow {
  constructor(engine: number, onTick: () => void) {
    this.engine = engine;
    this.root = el('div', 'gpucell-device');
    this.root.setAttribute('data-engine', String(engine));
    const head = el('label', 'gpucell-device-head', this.root);
    this.check = el('input', 'gpucell-select', head);
    this.check.type = 'checkbox';
    this.check.title = 'Run later cells on this engine';
    this.check.addEventListener('change', onTick);
    this.label = el('span', 'gpucell-label', head);
    this.state = el('span', 'gpucell-state', head);
    this.done = el('span', 'gpucell-done', head);
    this.done.title = 'chunks done in the current or last run';
    const bars = el('div', 'gpucell-bars', this.root);
    this.util = new Bar('gpucell-util', bars);
    this.util.root.title = 'utilisation';
    this.mem = new Bar('gpucell-mem', bars);
    this.mem.root.title = 'memory';
    this.extra = el('div', 'gpucell-extra', this.root);
    this.note = el('div', 'gpucell-note', this.root);
  }

  update(d: DeviceView): void {
    if (this.check.checked !== d.selected) {
      this.check.checked = d.selected;
    }
    setText(this.label, d.label);
    setAttr(this.label, 'title', d.label);
    setText(this.state, d.state);
    setAttr(this.state, 'data-state', d.state);
    setAttr(this.state, 'title', d.stateTitle || null);
    setAttr(this.root, 'data-state', d.state);
    if (
      this.state.style.getPropertyValue('--gpucell-state-color') !== d.color
    ) {
      this.state.style.setProperty('--gpucell-state-color', d.color);
    }
    setText(this.done, d.doneText);
    show(this.done, d.doneText !== '');
    this.util.update(d.utilPct, d.utilText);
    this.mem.update(d.memPct, d.memText);
    setText(this.extra, d.extra);
    show(this.extra, d.extra !== '');
    setText(this.note, d.note);
    show(this.note, d.note !== '');
  }

  readonly engine: number;
  readonly root: HTMLDivElement;
  readonly check: HTMLInputElement;
  private label: HTMLSpanElement;
  private state: HTMLSpanElement;
  private done: HTMLSpanElement;
  private util: Bar;
  private mem: Bar;
  private extra: HTMLDivElement;
  private note: HTMLDivElement;
}

/** A pending background run's row: `div.gpucell-bg-run[data-cell]`. */
class BackgroundRow {
  constructor(cell: number, onCancel: (cell: number) => void) {
    this.root = el('div', 'gpucell-bg-run');
    this.root.setAttribute('data-cell', String(cell));
    const head = el('div', 'gpucell-bg-head', this.root);
    this.text = el('span', 'gpucell-bg-text', head);
    this.cancel = el(
      'button',
      'gpucell-bg-cancel jp-mod-styled jp-mod-warn',
      head
    );
    this.cancel.textContent = 'Cancel';
    this.cancel.title =
      `gpucell.runs.cell(${cell}).cancel(): stop the run, merge nothing ` +
      '(finished chunks are kept for --resume)';
    this.cancel.addEventListener('click', () => onCancel(cell));
    this.bar = new Bar('gpucell-bg-bar', this.root);
    this.writes = el('div', 'gpucell-bg-writes', this.root);
    this.writes.title =
      'a later cell that uses one of these names waits for the run';
    this.started = el('div', 'gpucell-bg-started', this.root);
    this.note = el('div', 'gpucell-bg-note', this.root);
  }

  update(r: BackgroundRunView): void {
    setAttr(this.root, 'data-state', r.state);
    setText(this.text, r.text);
    this.bar.update(r.pct, '');
    setText(this.writes, r.writes);
    show(this.writes, r.writes !== '');
    setText(this.started, r.started);
    setText(this.note, r.note);
    show(this.note, r.note !== '');
  }

  readonly root: HTMLDivElement;
  private text: HTMLSpanElement;
  private cancel: HTMLButtonElement;
  private bar: Bar;
  private writes: HTMLDivElement;
  private started: HTMLDivElement;
  private note: HTMLDivElement;
}

/** The "GPU cluster" side panel. */
export class GpucellPanel extends Widget {
  constructor(actions: PanelActions) {
    super();
    this._actions = actions;
    this.id = PANEL_ID;
    this.addClass('gpucell-panel');
    this.title.label = PANEL_TITLE;
    this.title.caption = PANEL_TITLE;
    const root = this.node;

    this._hint = el('div', 'gpucell-hint', root);
    this._body = el('div', 'gpucell-body', root);

    const conn = el('div', 'gpucell-connection', this._body);
    this._connText = el('div', 'gpucell-connection-text', conn);
    this._connHosts = el('div', 'gpucell-connection-hosts', conn);

    const controls = el('div', 'gpucell-controls', this._body);
    this._args = el('input', 'gpucell-start-args jp-mod-styled', controls);
    this._args.type = 'text';
    this._args.placeholder = '-n 2 --gpus none';
    this._args.title = 'arguments of %gpu_cluster start';
    this._args.addEventListener('keydown', e => {
      if (e.key === 'Enter' && !this._start.disabled) {
        this._startClicked();
      }
    });
    this._start = el(
      'button',
      'gpucell-start jp-mod-styled jp-mod-accept',
      controls
    );
    this._start.textContent = 'Start';
    this._start.title = '%gpu_cluster start ARGS';
    this._start.addEventListener('click', () => this._startClicked());
    this._stop = el(
      'button',
      'gpucell-stop jp-mod-styled jp-mod-warn',
      controls
    );
    this._stop.textContent = 'Stop';
    this._stop.title = '%gpu_cluster stop';
    this._stop.addEventListener('click', () => this._actions.stop());

    this._devices = el('div', 'gpucell-devices', this._body);

    this._charts = el('div', 'gpucell-charts', this._body);
    this._chartsTitle = el('div', 'gpucell-charts-title', this._charts);
    this._utilChart = this._chart('util', 'utilisation per device, percent');
    this._memChart = this._chart('mem', 'memory used per device, percent');
    this._legend = el('div', 'gpucell-legend', this._charts);

    this._run = el('div', 'gpucell-run', this._body);
    this._runBar = new Bar('gpucell-run-bar', this._run);
    this._runText = el('div', 'gpucell-run-text', this._run);

    this._bg = el('div', 'gpucell-background', this._body);
    this._bgTitle = el('div', 'gpucell-background-title', this._bg);
    this._bgPending = el('div', 'gpucell-background-pending', this._bg);
    this._bgRecent = el('div', 'gpucell-background-recent', this._bg);

    this._last = el('div', 'gpucell-last', this._body);
    this._lastTitle = el('div', 'gpucell-last-title', this._last);
    this._lastLines = el('div', 'gpucell-last-lines', this._last);
    this._timelineBox = el('div', 'gpucell-timeline-box', this._last);

    this._reply = el('div', 'gpucell-reply', this._body);
  }

  /** Show a view model (cheap when little changed). */
  render(vm: ViewModel): void {
    setAttr(this.node, 'data-seq', vm.seq === null ? null : String(vm.seq));
    show(this._hint, vm.hint !== null);
    setText(this._hint, vm.hint ?? '');
    show(this._body, vm.loaded);

    setText(this._connText, vm.connection?.text ?? '');
    setText(
      this._connHosts,
      vm.connection?.hosts ? `hosts: ${vm.connection.hosts}` : ''
    );
    show(this._connHosts, !!vm.connection?.hosts);
    this._start.disabled = !vm.canStart;
    this._args.disabled = !vm.canStart;
    this._stop.disabled = !vm.canStop;

    this._renderDevices(vm);
    this._renderCharts(vm.charts);

    show(this._run, vm.run !== null);
    if (vm.run) {
      setAttr(this._run, 'data-done', String(vm.run.done));
      setAttr(this._run, 'data-status', vm.run.status);
      this._runBar.update(vm.run.pct, '');
      setText(this._runText, vm.run.text);
    }

    this._renderBackground(vm.background);

    show(this._last, vm.last !== null);
    if (vm.last) {
      setText(this._lastTitle, `Last run #${vm.last.id}: ${vm.last.status}`);
      const key = JSON.stringify(vm.last.lines);
      if (key !== this._linesKey) {
        this._linesKey = key;
        this._lastLines.replaceChildren(
          ...vm.last.lines.map(line => {
            const e = el('div', 'gpucell-last-line');
            e.textContent = line;
            return e;
          })
        );
      }
      this._renderTimeline(vm.last.timelineSrc, `Last run #${vm.last.id}`);
    }

    show(this._reply, vm.reply !== null);
    setText(this._reply, vm.reply?.text ?? '');
    this._reply.classList.toggle('gpucell-reply-error', !!vm.reply?.error);
  }

  private _renderBackground(b: BackgroundView | null): void {
    show(this._bg, b !== null);
    if (b === null) {
      return;
    }
    setText(this._bgTitle, b.title);
    const seen = new Set<number>();
    b.pending.forEach((r, i) => {
      seen.add(r.cell);
      let row = this._bgRows.get(r.cell);
      if (!row) {
        row = new BackgroundRow(r.cell, cell => this._actions.cancel(cell));
        this._bgRows.set(r.cell, row);
      }
      if (this._bgPending.children[i] !== row.root) {
        this._bgPending.insertBefore(
          row.root,
          this._bgPending.children[i] ?? null
        );
      }
      row.update(r);
    });
    for (const [cell, row] of this._bgRows) {
      if (!seen.has(cell)) {
        row.root.remove();
        this._bgRows.delete(cell);
      }
    }
    const key = JSON.stringify(b.recent);
    if (key !== this._bgRecentKey) {
      this._bgRecentKey = key;
      this._bgRecent.replaceChildren(
        ...b.recent.map(r => {
          const e = el('div', 'gpucell-bg-ended');
          e.setAttribute('data-cell', String(r.cell));
          e.setAttribute('data-outcome', r.outcome);
          e.classList.toggle('gpucell-bg-failed', r.error);
          e.textContent = r.text;
          return e;
        })
      );
    }
  }

  private _chart(kind: string, alt: string): HTMLImageElement {
    const img = el('img', 'gpucell-chart', this._charts);
    img.setAttribute('data-kind', kind);
    img.alt = alt;
    return img;
  }

  private _renderCharts(c: ChartsView | null): void {
    show(this._charts, c !== null);
    if (c === null) {
      return;
    }
    setText(this._chartsTitle, c.title);
    for (const [img, chart] of [
      [this._utilChart, c.util],
      [this._memChart, c.mem]
    ] as const) {
      if (img.getAttribute('src') !== chart.src) {
        img.setAttribute('src', chart.src);
      }
      setAttr(img, 'data-points', String(chart.points));
    }
    const key = JSON.stringify(c.legend);
    if (key !== this._legendKey) {
      this._legendKey = key;
      this._legend.replaceChildren(
        ...c.legend.map(entry => {
          const e = el('span', 'gpucell-legend-entry');
          e.setAttribute('data-engine', String(entry.engine));
          const swatch = el('span', 'gpucell-legend-swatch', e);
          swatch.style.background = entry.color;
          e.appendChild(document.createTextNode(entry.label));
          return e;
        })
      );
    }
  }

  private _renderTimeline(src: string | null, title: string): void {
    if (src === null) {
      this._timeline?.remove();
      this._timeline = null;
      return;
    }
    if (this._timeline === null) {
      const img = el('img', 'gpucell-timeline', this._timelineBox);
      img.alt = 'timeline of the last run: chunks per engine over time';
      img.title = 'click: open it large';
      // the panel is too narrow to read it: a click opens it in the main area
      img.addEventListener('click', () => {
        const at = img.getAttribute('src');
        if (at) {
          this._actions.openTimeline(at, this._timelineTitle);
        }
      });
      this._timeline = img;
    }
    this._timelineTitle = title;
    if (this._timeline.getAttribute('src') !== src) {
      this._timeline.setAttribute('src', src);
    }
  }

  private _renderDevices(vm: ViewModel): void {
    const container = this._devices;
    const seenHosts = new Set<string>();
    const seenEngines = new Set<number>();
    const order: number[] = [];
    vm.hosts.forEach((g, hi) => {
      seenHosts.add(g.host);
      let group = this._groups.get(g.host);
      if (!group) {
        const root = el('div', 'gpucell-host-group');
        root.setAttribute('data-host', g.host);
        const header = el('div', 'gpucell-host', root);
        group = { root, header };
        this._groups.set(g.host, group);
      }
      setText(group.header, g.host);
      if (container.children[hi] !== group.root) {
        container.insertBefore(group.root, container.children[hi] ?? null);
      }
      g.devices.forEach((d, di) => {
        seenEngines.add(d.engine);
        order.push(d.engine);
        let row = this._rows.get(d.engine);
        if (!row) {
          row = new DeviceRow(d.engine, () => this._ticked());
          this._rows.set(d.engine, row);
        }
        const at = group!.root.children[di + 1] ?? null; // 0 is the header
        if (at !== row.root) {
          group!.root.insertBefore(row.root, at);
        }
        row.update(d);
      });
    });
    for (const [engine, row] of this._rows) {
      if (!seenEngines.has(engine)) {
        row.root.remove();
        this._rows.delete(engine);
      }
    }
    for (const [host, group] of this._groups) {
      if (!seenHosts.has(host)) {
        group.root.remove();
        this._groups.delete(host);
      }
    }
    this._order = order;
  }

  private _ticked(): void {
    const ticks = this._order.map(engine => ({
      engine,
      checked: this._rows.get(engine)?.check.checked ?? false
    }));
    this._actions.select(ticks);
  }

  private _startClicked(): void {
    this._actions.start(this._args.value.trim());
  }

  private _actions: PanelActions;
  private _hint: HTMLDivElement;
  private _body: HTMLDivElement;
  private _connText: HTMLDivElement;
  private _connHosts: HTMLDivElement;
  private _args: HTMLInputElement;
  private _start: HTMLButtonElement;
  private _stop: HTMLButtonElement;
  private _devices: HTMLDivElement;
  private _groups = new Map<
    string,
    { root: HTMLDivElement; header: HTMLDivElement }
  >();
  private _rows = new Map<number, DeviceRow>();
  private _order: number[] = [];
  private _run: HTMLDivElement;
  private _runBar: Bar;
  private _runText: HTMLDivElement;
  private _bg: HTMLDivElement;
  private _bgTitle: HTMLDivElement;
  private _bgPending: HTMLDivElement;
  private _bgRecent: HTMLDivElement;
  private _bgRows = new Map<number, BackgroundRow>();
  private _bgRecentKey = '';
  private _last: HTMLDivElement;
  private _lastTitle: HTMLDivElement;
  private _lastLines: HTMLDivElement;
  private _linesKey = '';
  private _timelineBox: HTMLDivElement;
  private _timeline: HTMLImageElement | null = null;
  private _timelineTitle = '';
  private _charts: HTMLDivElement;
  private _chartsTitle: HTMLDivElement;
  private _utilChart: HTMLImageElement;
  private _memChart: HTMLImageElement;
  private _legend: HTMLDivElement;
  private _legendKey = '';
  private _reply: HTMLDivElement;
}

/** The status-bar item: `.gpucell-status`, the state's status text. */
export class StatusItem extends Widget {
  constructor(onClick: () => void) {
    super();
    this.addClass('gpucell-status');
    this.node.title = `Show the ${PANEL_TITLE} panel (also in the View menu)`;
    this.node.addEventListener('click', onClick);
  }

  render(vm: ViewModel): void {
    setText(this.node, vm.status);
  }
}

/** The last run's timeline at full size: a main-area tab that scrolls. */
export class TimelineView extends Widget {
  constructor() {
    super();
    this.id = TIMELINE_ID;
    this.addClass('gpucell-timeline-view');
    this.title.closable = true;
    this._img = el('img', 'gpucell-timeline-large', this.node);
    this._img.alt = 'timeline of the last run: chunks per engine over time';
  }

  showTimeline(src: string, title: string): void {
    this.title.label = `${title}: timeline`;
    this.title.caption = this.title.label;
    if (this._img.getAttribute('src') !== src) {
      this._img.setAttribute('src', src);
    }
  }

  private _img: HTMLImageElement;
}
