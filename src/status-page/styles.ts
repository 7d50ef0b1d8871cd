// Owns the status page's CSS: inline in the page (no external asset), a shard table that becomes
// one card per shard, each cell labelled, below 900 px, and GPU rows whose parts stack below 700 px.
// One line per component.
import { PALETTE } from './colours.js';

export const CSS = `
:root{--fg:#1f2328;--muted:#57606a;--line:#d0d7de;--bg:#f6f8fa;--card:#fff}*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);background:var(--bg)}
header{background:#1f2328;color:#fff;padding:14px 28px;display:flex;flex-wrap:wrap;align-items:baseline;gap:6px 22px}
header h1{font-size:20px;margin:0;font-weight:650;overflow-wrap:anywhere}header h1 .host{font-weight:400;color:#c9d1d9}
header .meta{margin:0;color:#c9d1d9;font-size:13px}header .meta .outage{color:#ffb3ad;font-weight:600}
.counts{list-style:none;margin:0 0 0 auto;padding:0;display:flex;flex-wrap:wrap;gap:8px}
main{padding:16px 28px 8px;max-width:1480px}
h2{font-size:15px;margin:18px 0 8px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
.banner{border-radius:6px;padding:10px 14px;margin:8px 0;border:1px solid}.banner.error{background:#ffebe9;border-color:#cf222e;color:#82071e}
.banner.stale{background:#fff8c5;border-color:#bf8700;color:#4d2d00}
.banner code{font:12px/1.4 ui-monospace,"DejaVu Sans Mono",monospace;white-space:pre-wrap;overflow-wrap:anywhere;display:block;margin-top:4px}
.gpus{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:4px 16px}
.gpu{display:grid;grid-template-columns:200px minmax(0,1fr) 130px;grid-template-areas:"id bar used" "uuid legend legend";column-gap:16px;row-gap:3px;align-items:center;padding:7px 0;border-bottom:1px solid #eaeef2}
.gpu:last-child{border-bottom:0}.gpu-id{grid-area:id;min-width:0;overflow-wrap:anywhere}.gpu-index{font-weight:700;margin-right:10px}
.gpu-busy{margin-left:8px;font-size:11px;color:var(--muted)}
.gpu-mig{margin-left:8px;padding:0 6px;border:1px solid currentColor;border-radius:4px;font-size:11px}
.gpu-uuid{grid-area:uuid;min-width:0;color:var(--muted);font:10px/1.3 ui-monospace,"DejaVu Sans Mono",monospace;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.gpu-used{grid-area:used;text-align:right;font-variant-numeric:tabular-nums;font-weight:600;white-space:nowrap}
.section-head{display:flex;align-items:baseline;gap:16px;flex-wrap:wrap}
.key{list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12px;color:var(--muted)}
.bar{grid-area:bar;min-width:0;display:flex;height:22px;border-radius:4px;overflow:hidden;border:1px solid #afb8c1;background:#fff}
.bar.unknown{align-items:center;padding:0 8px;color:var(--muted);font-size:12px;white-space:nowrap;text-overflow:ellipsis;background:repeating-linear-gradient(135deg,#f6f8fa 0 6px,#eaeef2 6px 12px)}
.gpu.lost .gpu-index,.gpu.lost .gpu-name{color:var(--muted);text-decoration:line-through}.gpu.lost .gpu-used{color:var(--muted);font-weight:400}
.gpu-id .badge{margin-left:8px}
.bar.lost{height:auto;min-height:22px;align-items:center;padding:2px 8px;color:var(--muted);font-size:12px;line-height:1.3;border-style:dashed;background:#eaeef2}
.seg{min-width:0;display:flex;align-items:center;overflow:hidden;white-space:nowrap;font-size:12px;font-weight:600}
.seg span{padding:0 6px;overflow:hidden;text-overflow:ellipsis}.seg.shard{min-width:3px}.seg+.seg{border-left:1px solid #fff}
.foreign{background:repeating-linear-gradient(135deg,#6e7781 0 4px,#afb8c1 4px 8px);color:#fff}
.foreign span{background:#57606a;border-radius:3px;margin:0 4px;padding:0 4px}
.reserved{background:#424a53}.free{background:#fff}.stray{box-shadow:inset 0 0 0 2px #cf222e}
${PALETTE.map(([bg, fg], i) => `.c${i}{background:${bg};color:${fg}}`).join('\n')}
.f1{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.5) 0 3px,transparent 3px 7px)}
.f2{background-image:radial-gradient(rgba(0,0,0,.45) 1.5px,transparent 2px);background-size:5px 5px}
.seg.f1 span,.seg.f2 span{background-color:inherit;border-radius:3px;margin:0 3px}
.legend{grid-area:legend;min-width:0;list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12px;color:var(--muted)}
.legend li{min-width:0;overflow-wrap:anywhere}.legend b{color:var(--fg);font-weight:600}.legend em{color:#cf222e;font-style:normal;font-weight:600}
.legend .idle,.legend .unreachable,.empty.unreachable{color:#82071e}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;vertical-align:-1px;border:1px solid rgba(0,0,0,.25)}
.table-wrap{overflow-x:auto;background:var(--card);border:1px solid var(--line);border-radius:8px}table{width:100%;border-collapse:collapse}
th,td{text-align:left;vertical-align:top;padding:8px 12px;border-bottom:1px solid #eaeef2}
tbody tr:last-child th,tbody tr:last-child td{border-bottom:0}
thead th{white-space:nowrap;background:#eaeef2;font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
tbody th{position:relative;padding-left:30px;min-width:calc(30px + 14ch);font-weight:600}tbody th>.sw{position:absolute;left:12px;top:12px}
tbody th .id,tbody th small{display:block;max-width:36ch;overflow-wrap:anywhere}tbody th small{font-weight:400;color:var(--muted)}
td{font-variant-numeric:tabular-nums}td.given{white-space:nowrap}td.held{min-width:11ch}
td.why{min-width:26ch;max-width:620px;font-size:13px;overflow-wrap:anywhere}td.why p{margin:0 0 4px}
.note{margin:0;padding:6px 2px;font-size:12px}.warning{color:#6f4a00}.none{color:var(--muted)}.stray-tag{color:#a40e26;font-weight:600}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-size:12px;font-weight:700;white-space:nowrap}
.badge.ready{background:#1a7f37;color:#fff}.badge.starting{background:#f2c744;color:#1f2328}.badge.on-cpu{background:#cf222e;color:#fff}
.badge.gpu-lost{background:#82071e;color:#fff}.badge.stopped{background:#8250df;color:#fff}.badge.exited{background:#6e7781;color:#fff}
.badge.unverified{background:#0969da;color:#fff}
.empty{background:var(--card);border:1px dashed var(--line);border-radius:8px;padding:14px;color:var(--muted)}
footer{padding:8px 28px 18px;color:var(--muted);font-size:12px;overflow-wrap:anywhere}footer a{color:#0550ae}
@media (max-width:900px){
.shards thead{position:absolute;width:1px;height:1px;overflow:hidden;clip-path:inset(50%);white-space:nowrap}
.shards,.shards tbody,.shards tr,.shards tbody th,.shards td{display:block}.shards tr{padding:6px 0;border-bottom:1px solid #eaeef2}
.shards tbody tr:last-child{border-bottom:0}.shards tbody th,.shards td{border:0;padding:3px 12px;min-width:0;max-width:none}
.shards tbody th{padding-left:30px}.shards tbody th>.sw{top:7px}.shards td{position:relative;padding-left:calc(12px + 6.5em);white-space:normal}
.shards td::before{content:attr(data-label);position:absolute;left:12px;top:5px;font-size:11px;font-weight:600;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
.shards tbody th .id,.shards tbody th small{max-width:none}
}
@media (max-width:700px){
header{padding:12px 14px}main{padding:12px 14px 8px}footer{padding:8px 14px 18px}.counts{margin-left:0}.gpus{padding:4px 12px}
.gpu{grid-template-columns:minmax(0,1fr) auto;grid-template-areas:"id used" "bar bar" "legend legend" "uuid uuid";padding:9px 0}
.gpu-uuid{white-space:normal;overflow-wrap:anywhere}
}
`;
