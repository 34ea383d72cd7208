/**
 * Charts of utilisation and memory over the last minutes, one line per device
 * (as jupyterlab-nvdashboard draws them), as plain SVG text.
 *
 * Pure (no DOM): the panel shows the SVG in an <img>, so jest checks the
 * drawing without a browser and no chart library is shipped.
 */

import { History } from './api';

/** One line: a device's values (percent, null: not measured) at ages (s <= 0). */
export interface Series {
  engine: number;
  name: string;
  color: string;
  age: number[];
  values: Array<number | null>;
}

export interface ChartSpec {
  title: string;
  /** seconds the x axis spans, ending at the last point */
  window: number;
  series: Series[];
  width?: number;
  height?: number;
}

/** The SVG and how many measured points it draws (the browser test reads it). */
export interface Chart {
  svg: string;
  points: number;
}

/** Tableau's ten colours: distinct on light and dark themes. */
export const PALETTE = [
  '#4e79a7',
  '#f28e2b',
  '#e15759',
  '#76b7b2',
  '#59a14f',
  '#edc948',
  '#b07aa1',
  '#ff9da7',
  '#9c755f',
  '#bab0ac'
];

/** The colour of the i-th device shown (the same in both charts and the legend). */
export function seriesColor(i: number): string {
  return PALETTE[((i % PALETTE.length) + PALETTE.length) % PALETTE.length];
}

export function escapeXml(text: string): string {
  return text
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;');
}

/** "5 min", "90 s": the x axis's left end. */
export function spanText(seconds: number): string {
  return seconds >= 120 && seconds % 60 === 0
    ? `${seconds / 60} min`
    : `${Math.round(seconds)} s`;
}

/**
 * Seconds the x axis spans for a history: what exists, rounded up to a step
 * (5 s under a minute, 15 s under two, 30 s beyond), until the window fills.
 *
 * A fixed 5-minute axis drew the first minutes as a sliver at the right edge;
 * an axis of exactly what exists would rescale every second.  Rounded up,
 * the points fill most of the width from the first seconds and the axis
 * changes only every few seconds; its left end is labelled with the span.
 */
export function chartSpan(h: History): number {
  const window = h.window > 0 ? h.window : 1;
  let oldest = 0;
  for (const d of h.devices) {
    for (const a of d.age) {
      if (Number.isFinite(a) && -a > oldest) {
        oldest = -a;
      }
    }
  }
  const step = oldest < 60 ? 5 : oldest < 120 ? 15 : 30;
  const span = Math.max(step, Math.ceil(oldest / step - 1e-9) * step);
  return Math.min(window, span);
}

/**
 * Runs of consecutive measured points: a null (not measured) breaks the
 * line rather than drawing it down to zero.
 */
export function runs(
  age: number[],
  values: Array<number | null>
): Array<Array<[number, number]>> {
  const out: Array<Array<[number, number]>> = [];
  let cur: Array<[number, number]> = [];
  const n = Math.min(age.length, values.length);
  for (let i = 0; i < n; i++) {
    const v = values[i];
    if (v === null || !Number.isFinite(v) || !Number.isFinite(age[i])) {
      if (cur.length) {
        out.push(cur);
      }
      cur = [];
    } else {
      cur.push([age[i], v]);
    }
  }
  if (cur.length) {
    out.push(cur);
  }
  return out;
}

/** A 0-100 % line chart over the last `window` seconds. */
export function chartSvg(spec: ChartSpec): Chart {
  const W = spec.width ?? 300;
  const H = spec.height ?? 120;
  const left = 30;
  const right = 6;
  const top = 18;
  const bottom = 16;
  const pw = W - left - right;
  const ph = H - top - bottom;
  const win = spec.window > 0 ? spec.window : 1;
  const x = (age: number) =>
    left + Math.min(1, Math.max(0, 1 + age / win)) * pw;
  const y = (v: number) => top + (1 - Math.min(100, Math.max(0, v)) / 100) * ph;
  const f = (n: number) => n.toFixed(1);
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" ` +
      `viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="10">`,
    `<text x="${left}" y="12" font-weight="bold" fill="#616161">` +
      `${escapeXml(spec.title)}</text>`
  ];
  for (const v of [0, 50, 100]) {
    parts.push(
      `<line x1="${left}" x2="${W - right}" y1="${f(y(v))}" y2="${f(y(v))}" ` +
        'stroke="#bdbdbd" stroke-width="0.5"/>',
      `<text x="${left - 3}" y="${f(y(v) + 3)}" text-anchor="end" ` +
        `fill="#757575">${v}%</text>`
    );
  }
  parts.push(
    `<text x="${left}" y="${H - 3}" fill="#757575">-${spanText(win)}</text>`,
    `<text x="${W - right}" y="${H - 3}" text-anchor="end" fill="#757575">now</text>`
  );
  let points = 0;
  for (const s of spec.series) {
    const color = escapeXml(s.color);
    for (const run of runs(s.age, s.values)) {
      points += run.length;
      if (run.length === 1) {
        const [a, v] = run[0];
        parts.push(
          `<circle cx="${f(x(a))}" cy="${f(y(v))}" r="1.5" fill="${color}"/>`
        );
      } else {
        const pts = run.map(([a, v]) => `${f(x(a))},${f(y(v))}`).join(' ');
        parts.push(
          `<polyline points="${pts}" fill="none" stroke="${color}" ` +
            'stroke-width="1.5" stroke-linejoin="round"/>'
        );
      }
    }
  }
  if (points === 0) {
    parts.push(
      `<text x="${left + pw / 2}" y="${top + ph / 2}" text-anchor="middle" ` +
        'fill="#9e9e9e">not measured yet</text>'
    );
  }
  parts.push('</svg>');
  return { svg: parts.join(''), points };
}

/** A legend entry: which colour is which device. */
export interface LegendEntry {
  engine: number;
  label: string;
  color: string;
}

/**
 * Both charts from the state's history; `labels` names the engines (the
 * cluster's device labels), others are called "engine N".
 */
export function historyCharts(
  h: History,
  labels: ReadonlyMap<number, string>
): { util: Chart; mem: Chart; legend: LegendEntry[]; span: number } {
  const legend = h.devices.map((d, i) => ({
    engine: d.engine,
    label: labels.get(d.engine) ?? `engine ${d.engine}`,
    color: seriesColor(i)
  }));
  const series = (key: 'util' | 'mem'): Series[] =>
    h.devices.map((d, i) => ({
      engine: d.engine,
      name: legend[i].label,
      color: legend[i].color,
      age: d.age,
      values: d[key]
    }));
  const span = chartSpan(h);
  return {
    util: chartSvg({
      title: 'Utilisation',
      window: span,
      series: series('util')
    }),
    mem: chartSvg({ title: 'Memory', window: span, series: series('mem') }),
    legend,
    span
  };
}
