/**
 * The open command: registered once, offered in the palette and the View menu.
 */

import {
  OPEN_COMMAND,
  OPEN_LABEL,
  PALETTE_CATEGORY,
  VIEW_MENU_RANK,
  registerOpenCommand
} from '../commands';

function fakes() {
  const commands = new Map<
    string,
    { label: string; caption: string; icon?: string; execute: () => unknown }
  >();
  const palette: Array<{ command: string; category: string }> = [];
  const menu: Array<{ items: Array<{ command: string }>; rank?: number }> = [];
  return {
    commands,
    palette,
    menu,
    registry: {
      addCommand: (
        id: string,
        o: {
          label: string;
          caption: string;
          icon?: string;
          execute: () => unknown;
        }
      ) => commands.set(id, o)
    },
    paletteLike: {
      addItem: (o: { command: string; category: string }) => palette.push(o)
    },
    menuLike: {
      addGroup: (items: Array<{ command: string }>, rank?: number) =>
        menu.push({ items, rank })
    }
  };
}

describe('the open command', () => {
  it('is in the palette and the View menu, and opens the panel', () => {
    const f = fakes();
    let opened = 0;
    registerOpenCommand(
      f.registry,
      () => {
        opened += 1;
      },
      f.paletteLike,
      f.menuLike,
      'icon'
    );
    const cmd = f.commands.get(OPEN_COMMAND)!;
    expect(OPEN_COMMAND).toBe('gpucell:open-panel');
    expect(cmd.label).toBe(OPEN_LABEL);
    expect(cmd.label).toMatch(/GPU cluster/);
    expect(cmd.label).toMatch(/gpucell/);
    expect(cmd.caption).toMatch(/panel/);
    expect(cmd.icon).toBe('icon');
    expect(f.palette).toEqual([
      { command: OPEN_COMMAND, category: PALETTE_CATEGORY }
    ]);
    expect(f.menu).toEqual([
      { items: [{ command: OPEN_COMMAND }], rank: VIEW_MENU_RANK }
    ]);
    cmd.execute();
    expect(opened).toBe(1);
  });

  it('is still registered without a palette or a menu (Notebook 7 may lack them)', () => {
    const f = fakes();
    registerOpenCommand(f.registry, () => undefined, null, null);
    expect([...f.commands.keys()]).toEqual([OPEN_COMMAND]);
    expect(f.palette).toEqual([]);
    expect(f.menu).toEqual([]);
  });
});
