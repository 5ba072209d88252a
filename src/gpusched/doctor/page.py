# ruff: noqa: E501
"""The GPU map: one static page, inline CSS and JS, no build chain. It reads ``/api/map`` and,
for a selected pending pod, ``/api/pod?name=NS/NAME``; ``?pod=NS/NAME`` in the page's address
selects one on load."""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpusched — GPU map</title>
<style>
body{font:13px system-ui,sans-serif;margin:0;background:#f5f6f8;color:#222}
header{background:#1f2937;color:#fff;padding:8px 16px;display:flex;gap:24px;align-items:baseline}
header h1{font-size:16px;margin:0} header span{opacity:.8}
main{display:grid;grid-template-columns:1fr 420px;gap:12px;padding:12px}
#nodes{display:flex;flex-wrap:wrap;gap:8px;align-content:flex-start}
.node{background:#fff;border:1px solid #d1d5db;border-radius:6px;padding:6px;width:196px}
.node.err{border-color:#dc2626;box-shadow:0 0 0 1px #dc2626}
.node h3{font-size:12px;margin:0 0 4px;display:flex;justify-content:space-between}
.node .meta{font-size:11px;color:#555;margin-bottom:4px}
.gpus{display:grid;grid-template-columns:repeat(4,1fr);gap:3px}
.gpu{height:34px;border:1px solid #9ca3af;border-radius:3px;display:flex;flex-direction:column-reverse;overflow:hidden;background:#eef2f7;position:relative}
.gpu.bad{border:2px solid #dc2626;background:repeating-linear-gradient(45deg,#fee2e2,#fee2e2 4px,#fff 4px,#fff 8px)}
.gpu .seg{width:100%}
.gpu .idx{position:absolute;top:0;left:2px;font-size:9px;color:#333}
.stranded{font-size:11px;color:#b45309}
.mig{position:relative;height:16px;border:1px solid #9ca3af;border-radius:3px;margin-top:3px;background:#eef2f7}
.mig.recut{border:2px dashed #7c3aed}
.mig .sl{position:absolute;top:0;bottom:0;box-sizing:border-box;border-right:2px solid #fff;font-size:8px;overflow:hidden;white-space:nowrap}
.mig .sl.free{background:#d1fae5}
aside{background:#fff;border:1px solid #d1d5db;border-radius:6px;padding:8px;align-self:start}
aside h2{font-size:14px;margin:4px 0}
.pending{cursor:pointer;padding:4px;border-bottom:1px solid #eee}
.pending:hover,.pending.sel{background:#eef2ff}
.pending .why{color:#555;font-size:11px}
.f-error{color:#b91c1c}.f-warn{color:#b45309}.f-ok{color:#15803d}.f-info{color:#0369a1}
.cf{background:#ecfdf5;border-left:3px solid #059669;padding:4px 6px;margin:3px 0}
.cf.first{font-weight:600}
table{border-collapse:collapse;font-size:12px} td,th{padding:2px 6px;border-bottom:1px solid #eee;text-align:left}
.legend span{display:inline-block;width:10px;height:10px;margin:0 3px 0 10px;border:1px solid #999}
</style></head>
<body>
<header><h1>gpusched — GPU map</h1><span id="summary">loading…</span>
<span class="legend"><span style="background:#eef2f7"></span>free<span style="background:#93c5fd"></span>held
<span style="background:#fee2e2;border-color:#dc2626"></span>unhealthy<span style="background:#d1fae5"></span>free MIG slice</span></header>
<main><div><div id="nodes"></div></div>
<aside><h2>Stranded capacity by model</h2><table id="stranded"></table>
<h2>Pending pods (<span id="npending">0</span>)</h2><div id="pending"></div>
<h2>Diagnosis</h2><div id="doctor"><i>select a pending pod</i></div></aside></main>
<script>
"use strict";
const el=(t,c,x)=>{const e=document.createElement(t);if(c)e.className=c;if(x!==undefined)e.textContent=x;return e};
function colour(s){let h=0;for(const ch of s)h=(h*31+ch.charCodeAt(0))>>>0;return `hsl(${h%360},65%,62%)`}
async function getJSON(u){const r=await fetch(u);const j=await r.json();if(!r.ok)throw new Error(j.error||r.statusText);return j}
function drawNodes(m){
  const box=document.getElementById("nodes");box.textContent="";
  for(const n of m.nodes){
    const d=el("div","node"+(n.errors?" err":""));d.dataset.node=n.name;
    const h=el("h3");h.append(el("span","",n.name),el("span","",n.model));d.append(h);
    d.append(el("div","meta",`${n.gpus.length} GPU`+((n.mig||[]).length?` · ${n.mig.length} MIG GPU`:"")+` · ${(n.gpu_memory_mib/1024).toFixed(0)} GiB`+(n.taints.length?` · taint ${n.taints.join(",")}`:"")));
    const g=el("div","gpus");
    for(const gpu of n.gpus){
      const c=el("div","gpu"+(gpu.healthy?"":" bad"));c.dataset.gpu=`${n.name}/${gpu.index}`;
      c.title=`GPU ${gpu.index}: ${gpu.free_milli} milli free`+(gpu.healthy?"":" (UNHEALTHY)")+gpu.pods.map(p=>`\n${p.pod} ${p.milli}`).join("");
      for(const p of gpu.pods){const s=el("div","seg");s.style.height=`${Math.max(4,p.milli/10)}%`;s.style.background=colour(p.pod);s.dataset.pod=p.pod;c.append(s)}
      c.append(el("span","idx",String(gpu.index)));g.append(c)}
    d.append(g);
    for(const mg of n.mig||[]){
      const b=el("div","mig"+(mg.reshaping?" recut":""));b.dataset.gpu=`${n.name}/${mg.index}`;
      b.title=`MIG GPU ${mg.index} (${mg.model})`+(mg.reshaping?" being re-cut":"")+(mg.mig_enabled?"":" MIG off")+mg.slices.map(x=>`\n${x.profile}@${x.start}: ${x.pod||"free"}`).join("");
      for(const x of mg.slices){const s=el("div","sl"+(x.pod?"":" free"),x.profile);
        s.style.left=`${100*x.start/mg.mem_slices}%`;s.style.width=`${100*x.size/mg.mem_slices}%`;
        if(x.pod){s.style.background=colour(x.pod);s.dataset.pod=x.pod}
        s.dataset.slice=`${mg.index}:${x.profile}@${x.start}`;b.append(s)}
      d.append(b)}
    if(n.stranded_milli>0)d.append(el("div","stranded",`stranded ${(n.stranded_milli/1000).toFixed(2)} GPU`));
    box.append(d)}
}
function drawSide(m){
  const t=document.getElementById("stranded");t.textContent="";
  const hr=el("tr");for(const x of["model","GPUs","free","stranded"])hr.append(el("th","",x));t.append(hr);
  for(const [model,v] of Object.entries(m.stranded_by_model)){const r=el("tr");
    for(const x of[model,v.gpus,(v.free_milli/1000).toFixed(2),(v.stranded_milli/1000).toFixed(2)])r.append(el("td","",String(x)));t.append(r)}
  document.getElementById("npending").textContent=m.pending.length;
  const p=document.getElementById("pending");p.textContent="";
  for(const q of m.pending){const d=el("div","pending");d.dataset.pod=q.pod;
    d.append(el("div","",q.pod),el("div","why",q.message));d.onclick=()=>select(q.pod);p.append(d)}
}
async function select(key){
  for(const d of document.querySelectorAll(".pending"))d.classList.toggle("sel",d.dataset.pod===key);
  const box=document.getElementById("doctor");box.textContent="…";
  try{const r=await getJSON(`api/pod?name=${encodeURIComponent(key)}`);box.textContent="";
    box.append(el("div","",`pod ${r.pod} (${r.phase})`));
    for(const f of r.findings){if(f.severity==="ok"&&f.level!=="scheduling")continue;box.append(el("div","f-"+f.severity,`${f.level} · ${f.code}: ${f.message}`))}
    r.counterfactuals.forEach((c,i)=>box.append(el("div","cf"+(i?"":" first"),(i?"":"→ ")+c.message+(c.verified?" ✓":""))));
  }catch(e){box.textContent=`error: ${e.message}`}
}
async function load(){
  try{const m=await getJSON("api/map");
    const gpus=m.nodes.reduce((a,n)=>a+n.gpus.length,0);
    document.getElementById("summary").textContent=`${m.nodes.length} nodes · ${gpus} GPUs · ${m.pending.length} pending · ${m.source}`;
    drawNodes(m);drawSide(m);
    const want=new URLSearchParams(location.search).get("pod")||(m.pending[0]&&m.pending[0].pod);
    if(want)await select(want);
    document.body.dataset.ready="1";
  }catch(e){document.getElementById("summary").textContent=`error: ${e.message}`;document.body.dataset.ready="error"}
}
load();
</script></body></html>
"""
